#!/usr/bin/env bash
# Emulated drives for tests and measurements of homes on several drives (issue 28): N file
# systems on loop devices, each limited to a chosen read bandwidth by the block I/O cgroup, and a
# way to run a command inside that cgroup (the limit applies only to processes in it).
#
#   tools/emulated-drives.sh up DIR SIZE BPS...   make one drive per BPS (e.g. 200M = 200 MB/s,
#                                                 decimal; 0 = no limit), each SIZE big (sparse
#                                                 image, e.g. 8G), mounted at DIR/drive-0 ...
#   tools/emulated-drives.sh run DIR -- CMD...    run CMD with the drives' read limits
#   tools/emulated-drives.sh down DIR             unmount, detach, delete the images and cgroup
#   tools/emulated-drives.sh status DIR           the drives, their devices and limits
#
# Needs root, losetup, mkfs.ext4 and the blkio cgroup: cgroup v1's blkio.throttle.read_bps_device
# where the blkio hierarchy is mounted (/sys/fs/cgroup/blkio), else cgroup v2's io.max. The loop
# devices read their image with direct I/O (losetup --direct-io=on), so the host's page cache
# holds no second copy and reads reach the real disk: keep the sum of the limits well below
# what that disk reads (deltafin bench --no-disk-probe off prints it). Images are sparse; the
# bytes written into the drives are what they take on the host.
set -euo pipefail

die() { echo "emulated-drives: $*" >&2; exit 1; }
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1
dir=$(realpath -m "$2")
shift 2
state=$dir/drives.state
cgname=deltafin-drives-$(echo -n "$dir" | cksum | cut -d' ' -f1)

cgroup_dir() {
  if [ -d /sys/fs/cgroup/blkio ] && [ -e /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device ]; then
    echo "v1 /sys/fs/cgroup/blkio/$cgname"
  elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
    echo "v2 /sys/fs/cgroup/$cgname"
  else
    return 1
  fi
}

bytes_per_s() {  # 200M -> 200000000 (decimal: drive makers' units)
  local v=$1
  case $v in
    *[kK]) echo $(( ${v%?} * 1000 )) ;;
    *M) echo $(( ${v%?} * 1000000 )) ;;
    *G) echo $(( ${v%?} * 1000000000 )) ;;
    *[!0-9]*|'') die "bandwidth $v: expected bytes/s, optionally with K, M or G (decimal)" ;;
    *) echo "$v" ;;
  esac
}

case $cmd in
  up)
    [ $# -ge 2 ] || usage
    [ "$(id -u)" = 0 ] || die "needs root (loop devices, mounts, cgroups)"
    command -v losetup >/dev/null && command -v mkfs.ext4 >/dev/null ||
      die "needs losetup and mkfs.ext4 (Debian: mount, e2fsprogs)"
    [ ! -e "$state" ] || die "$dir already has drives (run: $0 down $dir)"
    read -r version cg <<<"$(cgroup_dir)" || die "no blkio cgroup (v1 blkio or v2 io) on this machine"
    size=$1
    shift
    mkdir -p "$dir"
    mkdir -p "$cg"
    if [ "$version" = v2 ]; then
      echo +io > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    fi
    : > "$state"
    i=0
    for bw in "$@"; do
      bps=$(bytes_per_s "$bw")
      img=$dir/drive-$i.img
      mnt=$dir/drive-$i
      truncate -s "$size" "$img"
      mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img"
      dev=$(losetup --find --show --direct-io=on "$img")
      mkdir -p "$mnt"
      mount "$dev" "$mnt"
      majmin=$(lsblk -dno MAJ:MIN "$dev" | tr -d ' ')
      if [ "$bps" != 0 ]; then
        if [ "$version" = v1 ]; then
          echo "$majmin $bps" > "$cg/blkio.throttle.read_bps_device"
        else
          echo "$majmin rbps=$bps" > "$cg/io.max"
        fi
      fi
      echo "$i $dev $majmin $bps $mnt $img" >> "$state"
      echo "$mnt"
      i=$((i + 1))
    done
    echo "$version $cg" > "$dir/drives.cgroup"
    ;;
  run)
    [ "${1:-}" = "--" ] && shift
    [ $# -ge 1 ] || usage
    [ -e "$dir/drives.cgroup" ] || die "$dir has no drives (run: $0 up $dir ...)"
    read -r version cg < "$dir/drives.cgroup"
    echo $$ > "$cg/cgroup.procs"
    exec "$@"
    ;;
  down)
    if [ -e "$state" ]; then
      while read -r _ dev _ _ mnt img; do
        umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
        losetup -d "$dev" 2>/dev/null || true
        rm -f "$img"
        rmdir "$mnt" 2>/dev/null || true
      done < "$state"
      rm -f "$state"
    fi
    if [ -e "$dir/drives.cgroup" ]; then
      read -r version cg < "$dir/drives.cgroup"
      rmdir "$cg" 2>/dev/null || true
      rm -f "$dir/drives.cgroup"
    fi
    rmdir "$dir" 2>/dev/null || true
    ;;
  status)
    [ -e "$state" ] || die "$dir has no drives"
    cat "$dir/drives.cgroup"
    while read -r i dev majmin bps mnt _; do
      echo "drive $i: $mnt on $dev ($majmin), read limit $bps bytes/s, $(df -h --output=used "$mnt" | tail -1 | tr -d ' ') used"
    done < "$state"
    ;;
  *) usage ;;
esac
