#!/bin/sh
# dsv4-nvidia-uvm: load nvidia_uvm and create /dev/nvidia-uvm and /dev/nvidia-uvm-tools, as root,
# before the serving units start. CUDA in a sandboxed unit (NoNewPrivileges, ProtectKernelModules)
# cannot load the module itself through the setuid nvidia-modprobe, so after a reboot it would
# fail with "no CUDA-capable device" until something else loaded it.
set -eu
modprobe nvidia_uvm
if command -v nvidia-modprobe >/dev/null 2>&1; then
  exec nvidia-modprobe -u -c=0
fi
major=$(awk '$2 == "nvidia-uvm" {print $1}' /proc/devices)
[ -n "$major" ] || { echo "dsv4-nvidia-uvm: nvidia_uvm is loaded but has no character device" >&2; exit 1; }
[ -e /dev/nvidia-uvm ] || mknod -m 666 /dev/nvidia-uvm c "$major" 0
[ -e /dev/nvidia-uvm-tools ] || mknod -m 666 /dev/nvidia-uvm-tools c "$major" 1
