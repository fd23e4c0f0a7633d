#!/bin/sh
# Why does `modprobe nvidia` fail? Prints one finding per line, the likely cause first.
# Usage: module_load_diagnosis.sh KERNEL ROOT DKMS_DIR SYS_MODULE_DIR   (ROOT: "/" on a real box)
# Secure Boot is named only when the kernel says it refused the signature (dmesg), never from
# the Secure Boot state alone; nouveau holding the GPUs is named from /sys/module or NVRM's words.
kernel="$1"; root="$2"; dkms_dir="$3"; sys_module="${4:-/sys/module}"
headers="${root}lib/modules/${kernel}/build"
log=$(ls -t "$dkms_dir"/nvidia/*/build/make.log 2>/dev/null | head -n 1)
messages=$(dmesg 2>/dev/null | grep -iE 'nvidia|nvrm|nouveau|module verification|lockdown|key was rejected|unsigned module' | tail -n 8)
info=$(modinfo -k "$kernel" nvidia 2>&1 | grep -E '^(filename|version|signer|sig_key):')
secure=$(mokutil --sb-state 2>/dev/null)
rejected=$(echo "$messages" | grep -iE 'key was rejected|lockdown|module verification failed|unsigned module')
if [ -d "$sys_module/nouveau" ] || echo "$messages" | grep -qiE 'another driver was loaded and obtained ownership|probe routine was not called'; then
  echo "Cause: nouveau holds the GPUs (it is loaded, or NVRM says another driver owns the devices): the nvidia module finds no device. The nouveau blacklist is in place: reboot (or \`modprobe -r nouveau\` once nothing uses it), then provision again"
elif [ -n "$rejected" ] && echo "$secure" | grep -qi 'enabled' && [ -n "$info" ]; then
  if echo "$info" | grep -qi 'signer:'; then
    echo "Cause: Secure Boot rejects the module's signature ($(echo "$info" | grep -i signer: | sed 's/^signer: *//')): that key is not trusted by this firmware; enrol it (MOK) or use Canonical's signed modules"
  else
    echo "Cause: Secure Boot rejects the module: it is unsigned (a DKMS build without an enrolled MOK): use Canonical's signed modules or enrol the DKMS MOK"
  fi
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
echo "nouveau: $( [ -d "$sys_module/nouveau" ] && echo loaded || echo 'not loaded')"
echo "headers for ${kernel}: $( [ -e "$headers" ] && echo present || echo "missing (${headers})")"
echo "modinfo nvidia: $(echo "${info:-none for kernel ${kernel}}" | tr '\n' ' ')"
echo "dkms status: $(dkms status nvidia 2>&1 | tr '\n' ' ')"
[ -n "$log" ] && echo "DKMS log ${log} (last lines): $(tail -n 5 "$log" | tr '\n' ' ')"
echo "dmesg: $(echo "${messages:-nothing about nvidia}" | tr '\n' ' ')"
exit 0
