#!/usr/bin/env bash
# Soak run of `zinf train`: 2 ranks (started here with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
# which zinf's launch detection reads) train the tiny model for --steps steps at ZeRO stage 3
# with params and optimizer states on NVMe (a temporary folder under $TMPDIR or /var/tmp,
# removed at the end) and a checkpoint every --save-interval steps. Each rank's RSS, open fds,
# threads, pinned memory (VmLck: zinf mlock()s its pinned buffers; VmPin: io_uring's
# registered buffers) and swap-file sizes are sampled every second; after the warm-up they
# must be flat: the mean over the last quarter of the steps against the mean over the second
# quarter, within the tolerance each line states. Both ranks must also have trained (exit 0,
# a finite and falling loss on every step, the final summary, both ranks' files in every
# checkpoint).
#
# Usage: scripts/soak.sh [--steps N (1000)] [--save-interval N (50)] [--out DIR (./soak)]
#                        [--zinf BINARY (build/tools/zinf)] [--seq-len L] [--grad-accum N]
#                        [--interval S] [--tmp DIR] [--keep]
# Prints progress (step, ETA) while it runs, then a table, one line per check and
# "soak: N passed, M failed"; exit 1 when a check failed. DIR gets soak.csv (the samples),
# soak.png (their plot, by gnuplot), loss.csv, rank0.log, rank1.log, soak_config.json and
# report.txt. Needs only Debian's python3 and gnuplot.
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/soak.py" "$@"
