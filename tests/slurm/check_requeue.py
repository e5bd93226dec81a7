#!/usr/bin/env python3
"""Checks a requeued run against an uninterrupted one (tests/slurm/requeue.sh).

usage: check_requeue.py REF_RUN_DIR RUN_DIR JOB_OUTPUT EPOCHS AT_SIGNAL AT_REQUEUE

- both runs end at epoch EPOCHS on 2 ranks;
- the final records agree exactly on step, train_loss, val_loss, val_acc, val_correct;
- the requeued run's metrics.jsonl has every epoch 1..EPOCHS (none lost);
- the job output holds two starts, the first ending in the exit-75 requeue, and
  the second start resumed where the first stopped: its first epoch line is
  the epoch after the last one recorded before the requeue (not epoch 1).
"""
import json
import re
import sys

KEYS = ("step", "train_loss", "val_loss", "val_acc", "val_correct")


def load(run_dir):
    with open(run_dir + "/metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ref_dir, run_dir, log_path, epochs, at_signal, at_requeue = sys.argv[1:7]
    epochs = int(epochs)
    ref, run = load(ref_dir), load(run_dir)
    errors = []
    for name, recs in (("reference", ref), ("requeued", run)):
        if not recs or recs[-1].get("epoch") != epochs or recs[-1].get("world_size") != 2:
            errors.append(f"{name} run: final record {recs[-1] if recs else None} is not epoch {epochs} on 2 ranks")
    if ref and run:
        for k in KEYS:
            a, b = ref[-1].get(k), run[-1].get(k)
            print(f"final {k}: reference {a!r} requeued {b!r}")
            if a is None or a != b:
                errors.append(f"final {k} differs: reference {a!r}, requeued {b!r}")
    missing = sorted(set(range(1, epochs + 1)) - {r.get("epoch") for r in run})
    if missing:
        errors.append(f"requeued run's metrics.jsonl lacks epochs {missing[:10]}{' ...' if len(missing) > 10 else ''}")

    with open(log_path) as f:
        log = f.read()
    starts = re.split(r"^ddp_train job \d+ start \d+ at .*$", log, flags=re.M)[1:]
    print(f"job output: {len(starts)} starts; {at_signal} epochs recorded at the signal, {at_requeue} at the requeue")
    if len(starts) != 2:
        errors.append(f"job output holds {len(starts)} starts, expected 2")
    else:
        if "stopped with a checkpoint (exit 75); requeueing" not in starts[0]:
            errors.append("first start did not end with ddp_train's exit 75 and a requeue")
        first = re.search(r"^epoch (\d+)/(\d+)\s", starts[1], flags=re.M)
        resumed_at = int(first.group(1)) if first else None
        print(f"second start: first epoch line is epoch {resumed_at}")
        if resumed_at is None or resumed_at <= 1:
            errors.append(f"second start did not resume (first epoch line: {resumed_at}): "
                          "resume = 'auto' should continue from the checkpoint")
        elif resumed_at != int(at_requeue) + 1:
            errors.append(f"second start's first epoch is {resumed_at}, but {at_requeue} epochs were "
                          f"recorded when the job stopped: expected epoch {int(at_requeue) + 1}")
    if errors:
        print("FAIL: " + "; ".join(errors))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
