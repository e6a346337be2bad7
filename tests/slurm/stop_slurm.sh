#!/bin/bash
# Stop the daemons start_slurm.sh started (by PID, nothing else). Usage: stop_slurm.sh STATE_DIR.
state="$1"
[ -f "$state/pids" ] && xargs -r kill < "$state/pids" 2>/dev/null
sleep 1
exit 0
