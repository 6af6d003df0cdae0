#!/usr/bin/env python3
"""GPU load for the side-by-side benchmark: every GPU busy, NVLink carrying traffic.

One thread per GPU runs a bf16 matmul loop (8192 x 8192 by default: the tensor pipes and HBM
busy, the GPU at its power cap, as tests/hardware does); with two GPUs that can reach each other
(peer access), one more thread copies a buffer from cuda:0 to cuda:1 in a loop (512 MiB by
default), so NVLink carries traffic and its counters move. Prints ``ready`` once every loop has
run once; stops on SIGTERM or SIGINT (or after ``--seconds``) and writes what it did as JSON
(``--out``): iterations and TFLOP/s per GPU, bytes copied and GB/s.

Needs PyTorch with CUDA (the device image has it). Without it, or without a GPU, it prints one
JSON line ``{"error": ...}`` and exits 3, and the benchmark goes on without load.

    python3 bench/gpuload.py --out /tmp/load.json      # until SIGTERM
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192, help="matmul size n (n x n bf16)")
    ap.add_argument("--copy-mib", type=int, default=512, help="NVLink copy buffer, MiB (0: no copy)")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: at SIGTERM)")
    ap.add_argument("--out", help="write the statistics here at the end")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({"error": f"PyTorch not importable: {exc}"}), flush=True)
        return 3
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(json.dumps({"error": "no CUDA device"}), flush=True)
        return 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    devices = list(range(torch.cuda.device_count()))
    stats: dict[str, Any] = {"size": args.size, "gpus": {}, "copy": None}
    started: list[threading.Event] = []
    errors: list[str] = []

    def matmul(dev: int, ready: threading.Event) -> None:
        try:
            a = torch.randn(args.size, args.size, dtype=torch.bfloat16, device=f"cuda:{dev}")
            b = torch.randn(args.size, args.size, dtype=torch.bfloat16, device=f"cuda:{dev}")
            n, t0 = 0, time.perf_counter()
            while not stop.is_set():
                for _ in range(10):
                    a @ b
                torch.cuda.synchronize(dev)
                n += 10
                ready.set()
            secs = time.perf_counter() - t0
            stats["gpus"][str(dev)] = {
                "iterations": n,
                "seconds": round(secs, 2),
                "tflops": round(2 * args.size**3 * n / secs / 1e12, 1) if secs else None,
            }
        except Exception as exc:  # noqa: BLE001 - reported in the statistics
            errors.append(f"cuda:{dev}: {exc!r}")
            ready.set()

    def copy(ready: threading.Event) -> None:
        try:
            src = torch.empty(args.copy_mib << 20, dtype=torch.uint8, device="cuda:0")
            dst = torch.empty_like(src, device="cuda:1")
            n, t0 = 0, time.perf_counter()
            while not stop.is_set():
                dst.copy_(src)
                torch.cuda.synchronize(0)
                torch.cuda.synchronize(1)
                n += 1
                ready.set()
            secs = time.perf_counter() - t0
            moved = n * src.numel()
            stats["copy"] = {"bytes": moved, "seconds": round(secs, 2), "gb_per_s": round(moved / secs / 1e9, 1)}
        except Exception as exc:  # noqa: BLE001
            errors.append(f"copy: {exc!r}")
            ready.set()

    threads = []
    for dev in devices:
        ev = threading.Event()
        started.append(ev)
        threads.append(threading.Thread(target=matmul, args=(dev, ev), daemon=True))
    peer = len(devices) >= 2 and args.copy_mib > 0 and torch.cuda.can_device_access_peer(0, 1)
    if peer:
        ev = threading.Event()
        started.append(ev)
        threads.append(threading.Thread(target=copy, args=(ev,), daemon=True))
    stats["nvlink_copy"] = peer
    for t in threads:
        t.start()
    for ev in started:
        ev.wait(300)
    print("ready" if not errors else json.dumps({"error": errors}), flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds > 0 else None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        stop.wait(0.5)
    stop.set()
    for t in threads:
        t.join(60)
    stats["errors"] = errors
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(stats, fh, indent=1)
    print(json.dumps(stats), flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
