#!/bin/sh
# PID 1 of the user-mode-linux guest that kubeproxy.lab.uml boots (see that module).
#
# The kernel mounted the host's / read-only over hostfs. This script puts a tmpfs-backed
# overlay on top and pivots into it, so the guest may write anywhere while the host's files
# never change; mounts the usual pseudo filesystems; points /lib/modules at the UML kernel's
# modules and loads IPVS and friends; mounts the control directory (kp_ctl=) and every
# kp_rw= directory read-write from the host; runs $kp_ctl/run.sh with stdout on the first
# serial line and stderr on the second (the host's own stdout/stderr, byte-exact once the
# lines are raw); writes its exit status to $kp_ctl/rc and powers off, at the latest
# kp_timeout= seconds after boot. Progress and errors
# before the command starts go to the console, which the host keeps as console.log.
set -u
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

fail() {
    echo "uml_init: $*" >&2
    sync
    poweroff -f -f
}

mount -t proc proc /proc || fail "mount /proc"
kp_ctl="" kp_rw="" kp_modules="" kp_timeout=""
for word in $(cat /proc/cmdline); do
    case $word in
    kp_ctl=*) kp_ctl=${word#kp_ctl=} ;;
    kp_rw=*) kp_rw=${word#kp_rw=} ;;
    kp_modules=*) kp_modules=${word#kp_modules=} ;;
    kp_timeout=*) kp_timeout=${word#kp_timeout=} ;;
    esac
done
[ -n "$kp_ctl" ] || fail "no kp_ctl= on the kernel command line"
if [ -n "$kp_timeout" ]; then
    # The host kills the guest at its deadline; this covers a host that died first.
    (sleep "$kp_timeout" && echo "uml_init: deadline passed, powering off" >&2 && poweroff -f -f) &
fi
release=$(uname -r)
uml_modules=/usr/lib/uml/modules/$release

# Overlay: the host root read-only below, a tmpfs above; the tmpfs lives on /run of the old
# root, which pivot_root keeps reachable until it is lazily unmounted.
mount -t tmpfs -o mode=0755 tmpfs /run || fail "mount tmpfs"
mkdir -p /run/kp/lower /run/kp/upper /run/kp/work /run/kp/root
mount -r -t hostfs -o / none /run/kp/lower || fail "mount hostfs /"
insmod "$uml_modules/kernel/fs/overlayfs/overlay.ko" || fail "insmod overlay"
mount -t overlay overlay \
    -o lowerdir=/run/kp/lower,upperdir=/run/kp/upper,workdir=/run/kp/work /run/kp/root ||
    fail "mount overlay"
mkdir -p /run/kp/root/.oldroot
cd /run/kp/root && pivot_root . .oldroot || fail "pivot_root"
cd /

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
umount -l /.oldroot
# `ip netns` keeps its namespace handles here.
mkdir -p /run/netns

mkdir -p /lib/modules
ln -sfn "$uml_modules" "/lib/modules/$release"

for dir in "$kp_ctl" $(echo "$kp_rw" | tr ',' ' '); do
    mount -t hostfs -o "$dir" none "$dir" || fail "mount hostfs $dir read-write"
done

if [ -n "$kp_modules" ]; then
    # shellcheck disable=SC2046 # one word per module
    modprobe -a $(echo "$kp_modules" | tr ',' ' ') || fail "modprobe $kp_modules"
fi

hostname uml-guest
stty -F /dev/ttyS0 raw -echo || fail "stty ttyS0"
stty -F /dev/ttyS1 raw -echo || fail "stty ttyS1"
sh "$kp_ctl/run.sh" </dev/null >/dev/ttyS0 2>/dev/ttyS1
echo $? >"$kp_ctl/rc.tmp" && mv "$kp_ctl/rc.tmp" "$kp_ctl/rc"
sync
poweroff -f -f
