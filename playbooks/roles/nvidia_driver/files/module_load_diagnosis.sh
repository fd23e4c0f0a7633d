#!/bin/sh
# Why does `modprobe nvidia` fail? Prints one finding per line, the likely cause first.
# Usage: module_load_diagnosis.sh KERNEL ROOT DKMS_DIR   (ROOT: "/" on a real box)
kernel="$1"; root="$2"; dkms_dir="$3"
headers="${root}lib/modules/${kernel}/build"
log=$(ls -t "$dkms_dir"/nvidia/*/build/make.log 2>/dev/null | head -n 1)
messages=$(dmesg 2>/dev/null | grep -iE 'nvidia|nvrm|module verification|lockdown|key was rejected' | tail -n 8)
info=$(modinfo -k "$kernel" nvidia 2>&1 | grep -E '^(filename|version|signer|sig_key):')
secure=$(mokutil --sb-state 2>/dev/null)
if echo "$messages $secure" | grep -qiE 'key was rejected|lockdown|module verification failed|secureboot enabled' && [ -n "$info" ]; then
  echo "Cause: Secure Boot rejects the module (it is not signed by an enrolled key): use Canonical's signed modules or enrol the DKMS MOK"
elif [ -z "$info" ] && [ ! -e "$headers" ]; then
  echo "Cause: no nvidia module was built for kernel ${kernel}: its headers are missing (${headers}), so DKMS could not build it"
elif [ -z "$info" ] && [ -n "$log" ]; then
  echo "Cause: the DKMS build of the nvidia module failed for kernel ${kernel}: see ${log}"
elif [ -z "$info" ]; then
  echo "Cause: no nvidia module exists for kernel ${kernel} (DKMS built none: \`dkms status\` says why)"
elif echo "$messages" | grep -qiE 'mismatch|API'; then
  echo "Cause: the module and the driver's user-space do not match (a partial upgrade): reboot, or reinstall the driver packages"
else
  echo "Cause: unknown: the module exists but the kernel refused it (see dmesg below)"
fi
echo "Secure Boot: ${secure:-unknown (no mokutil)}"
echo "headers for ${kernel}: $( [ -e "$headers" ] && echo present || echo "missing (${headers})")"
echo "modinfo nvidia: $(echo "${info:-none for kernel ${kernel}}" | tr '\n' ' ')"
echo "dkms status: $(dkms status nvidia 2>&1 | tr '\n' ' ')"
[ -n "$log" ] && echo "DKMS log ${log} (last lines): $(tail -n 5 "$log" | tr '\n' ' ')"
echo "dmesg: $(echo "${messages:-nothing about nvidia}" | tr '\n' ' ')"
exit 0
