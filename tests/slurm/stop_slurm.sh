#!/bin/bash
# Stop the daemons start_slurm.sh started (by PID, nothing else). Usage: stop_slurm.sh STATE_DIR.
state="$1"
[ -f "$state/pids" ] && xargs -r kill < "$state/pids" 2>/dev/null
sleep 1
# the configuration start_slurm.sh wrote goes, and whatever was there before comes back
if [ -e "$state/slurm.conf.before" ]; then
  cp -p "$state/slurm.conf.before" /etc/slurm/slurm.conf
elif [ -e "$state/slurm.conf.written" ]; then
  rm -f /etc/slurm/slurm.conf
fi
exit 0
