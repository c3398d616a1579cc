"""A trainer that knows nothing of spotbroker: no checkpoint library, no
checkpoints of its own. Deterministic, so a run started over from step 0
ends where an uninterrupted one does."""
import argparse
import time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--step-seconds", type=float, default=0.0)
args = p.parse_args()

print("start_step=0", flush=True)
state = 7
for step in range(args.steps):
    state = (state * 31 + step) % 1_000_003
    print(f"step={step + 1} state={state}", flush=True)
    time.sleep(args.step_seconds)
print(f"final_loss={state}", flush=True)
