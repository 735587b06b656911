#!/usr/bin/env python3
"""Are `deltafin doctor`'s forecasts honest? A timed test (ctest label `perf`, `make test-perf`;
never part of `make test`, whose machines are shared and whose timings are noise).

For two `make-model --preset k3` shapes, each in RAM (the default budget) and out of core (a
budget that streams part of the trunk or holds part of the experts), it runs `doctor --json`,
then `bench --json`, then `doctor --json` again, and compares the mean of the two forecasts
(bracketing the measurement, so a host whose speed drifts during the run is seen by both) with
the measured median decode and prefill speeds. Every forecast must be within +-25% of what was
measured. It prints one table row per case (docs/PERFORMANCE.md records a run).

Both commands run with `--threads 1` unless told otherwise: on a machine shared with other
sessions (the 2-core build machines, whose scheduler gives each session an equal share), one
thread gets a core most of the time, while two threads wait for each other at every product
whenever one of them is descheduled, so a two-thread measurement swings with the neighbours'
load far more than any forecast can follow. On a machine of your own, pass `--threads N`.
Out of core, the engine reads with O_DIRECT (the page cache serves none of its reads), so no
cache drop or cgroup limit is needed for an honest figure.

Usage: doctor_perf.py DELTAFIN_BINARY MODELS_DIR [--only NAME] [--reps N] [--threads N]
MODELS_DIR keeps the two models between runs (7.8 and 7.7 GB; made on first use).
"""
import json
import os
import subprocess
import sys
import time

SHAPES = {
    # name: make-model flags, out-of-core budget
    "k3-4l": (["--preset", "k3"], "5.5G"),
    "k3-h2048-6l-64e": (["--preset", "k3", "--hidden", "2048", "--layers", "6", "--experts", "64"], "4.2G"),
}
PROMPT, GEN = 64, 16
TOLERANCE = 0.25


def run_json(args):
    out = subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return json.loads(out.stdout)


def main():
    binary, models = sys.argv[1], sys.argv[2]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    reps = sys.argv[sys.argv.index("--reps") + 1] if "--reps" in sys.argv else "3"
    threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
    os.makedirs(models, exist_ok=True)
    rows, failures = [], []
    for name, (flags, budget) in SHAPES.items():
        if only and only != name:
            continue
        path = os.path.join(models, name)
        if not os.path.exists(os.path.join(path, "config.json")):
            print("making %s (%s)" % (path, " ".join(flags)), flush=True)
            subprocess.run([binary, "make-model", path, "--quiet"] + flags, check=True)
        for mode, extra in (("in RAM", []), ("out of core, budget " + budget, ["--memory-budget", budget])):
            common = ["--model", path, "--prompt-tokens", str(PROMPT), "--threads", threads] + extra
            before = run_json([binary, "doctor", "--json"] + common)
            t0 = time.time()
            bench = run_json([binary, "bench", "--json", "--gen-tokens", str(GEN), "--reps", reps] + common)
            after = run_json([binary, "doctor", "--json"] + common)
            f0, f1 = before["forecasts"][0], after["forecasts"][0]
            pred_decode = 2.0 / (f0["decode_s_per_token"] + f1["decode_s_per_token"])
            pred_prefill = (f0["prefill_tokens_per_s"] + f1["prefill_tokens_per_s"]) / 2
            meas_decode, meas_prefill = bench["decode_tokens_per_s"], bench["prefill_tokens_per_s"]
            row = {
                "model": name, "mode": mode,
                "decode_forecast": pred_decode, "decode_measured": meas_decode,
                "decode_ratio": pred_decode / meas_decode,
                "prefill_forecast": pred_prefill, "prefill_measured": meas_prefill,
                "prefill_ratio": pred_prefill / meas_prefill,
                "bytes_read_per_token_forecast": f0["bytes_read_per_token"],
                "bytes_read_per_token_measured": bench["bytes_read_per_token"],
                "hit_rate_forecast": f0["expert_hit_rate"], "hit_rate_measured": bench["expert_hit_rate"],
                "disk_bw": before["machine"]["disk_read_bytes_per_s"],
                "memory_bw": before["speeds"]["memory_bandwidth_bytes_per_s"],
                "bench_s": time.time() - t0,
            }
            rows.append(row)
            print("| {model} | {mode} | {decode_forecast:.3f} | {decode_measured:.3f} | {decode_ratio:.2f} | "
                  "{prefill_forecast:.2f} | {prefill_measured:.2f} | {prefill_ratio:.2f} | "
                  "{bytes_read_per_token_forecast:.3g} / {bytes_read_per_token_measured:.3g} | "
                  "{hit_rate_forecast:.2f} / {hit_rate_measured:.2f} |".format(**row), flush=True)
            for what in ("decode", "prefill"):
                if abs(row[what + "_ratio"] - 1) > TOLERANCE:
                    failures.append("%s %s: %s forecast %.3f vs measured %.3f (x%.2f)" % (
                        name, mode, what, row[what + "_forecast"], row[what + "_measured"],
                        row[what + "_ratio"]))
    print(json.dumps(rows))
    if failures:
        print("forecasts off by more than 25%:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
