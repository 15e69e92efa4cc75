"""Restart benchmark: how long a broker takes to be ready over a large commit log.

    .venv/bin/python bench/restart.py --size-mib 1024 --out /tmp/hac-restart

Writes about ``--size-mib`` of commit log (``--body-bytes`` messages over 4 topics x 4
queues) with the broker's own store code in a child process, then measures two restarts:

* ``clean``: the writer closed the store (a clean checkpoint);
* ``kill9``: a second writer reopened it, appended ``--tail-mib`` more while flushing the
  way the broker's async flush loop does (every ``--flush-interval-ms``), and was killed
  with SIGKILL in the middle of appending (unflushed bytes and a checkpoint behind them).

A third case, ``no_checkpoint`` (the clean store with its checkpoint file deleted),
shows what the fallback, a full walk verifying every record, costs; it is reported but
not held to the target.

For each case it times ``MessageStore.open`` alone in a fresh process (``store_open_s``)
and ``hactl broker`` on that store from spawn until its ready file appears
(``broker_ready_s``, interpreter start and imports included), and prints the ratio of
the latter to the 5 s target (``<= 1.0`` meets it).  ``--cold`` evicts the store's files
from the page cache first (``posix_fadvise(DONTNEED)`` on each file, nothing else), so
recovery reads from disk.  The generated store is reused when it exists with the same
parameters.  Opt-in: not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ha_controller.testing import ProcessHandle, hactl_argv, run_nameserver

MiB = 1 << 20
TARGET_S = 5.0
SEGMENT = 64 * MiB  # the broker's default segment_size_bytes
TOPICS = [f"Restart{i}" for i in range(4)]
QUEUES = 4

# Runs in a child: write until the commit log reaches ``target`` bytes.  mode "clean"
# closes the store; mode "kill" flushes every ``flush_ms`` like the broker's flush loop
# and SIGKILLs itself with unflushed records written.
_WRITER = """
import os, signal, sys, time
from pathlib import Path
from broker_agent.store import MessageStore, StoreConfig
store_dir, target, body_bytes, mode, flush_ms = (
    Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
topics = {topics!r}
store = MessageStore.open(store_dir, StoreConfig(segment_size_bytes={segment}))
body = os.urandom(body_bytes)
props = {{"TAGS": "bench", "KEYS": "k"}}
i = 0
last_flush = time.monotonic()
while store.commitlog_max_offset < target:
    store.put(topics[i % len(topics)], (i // len(topics)) % {queues}, body, props)
    i += 1
    if mode == "kill" and time.monotonic() - last_flush >= flush_ms / 1000:
        store.flush()
        last_flush = time.monotonic()
if mode == "kill":
    print(store.flushed_offset, store.commitlog_max_offset, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
store.close()
print(i, flush=True)
"""

_OPEN = """
import sys, time
from pathlib import Path
from broker_agent.store import MessageStore, StoreConfig
t0 = time.perf_counter()
store = MessageStore.open(Path(sys.argv[1]), StoreConfig(segment_size_bytes={segment}))
took = time.perf_counter() - t0
print(took, store.commitlog_max_offset, flush=True)
store.close()
"""


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root, "HAC_LOG_LEVEL": "WARNING"}


def _python(code: str, *args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=_env(),
        capture_output=True,
        text=True,
        check=check,
        timeout=1800,
    )


def write(store_dir: Path, target: int, body_bytes: int, mode: str, flush_ms: int) -> str:
    code = _WRITER.format(topics=TOPICS, segment=SEGMENT, queues=QUEUES)
    done = _python(code, store_dir, target, body_bytes, mode, flush_ms, check=False)
    expected = -signal.SIGKILL if mode == "kill" else 0
    if done.returncode != expected:
        raise RuntimeError(f"writer exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout.strip()


def evict(store_dir: Path) -> None:
    """Drop the store's file pages from the page cache (only these files)."""
    for path in store_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def time_store_open(store_dir: Path) -> tuple[float, int]:
    out = _python(_OPEN.format(segment=SEGMENT), store_dir).stdout.split()
    return float(out[0]), int(out[1])


def time_broker_ready(store_dir: Path, namesrv: str, workdir: Path) -> float:
    ready = workdir / "broker.ready.json"
    ready.unlink(missing_ok=True)
    argv = hactl_argv(
        "broker",
        "--broker-name",
        "restart",
        "--broker-id",
        "0",
        "--namesrv",
        namesrv,
        "--listen",
        "127.0.0.1:0",
        "--ha-listen",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--store-dir",
        str(store_dir),
        "--ready-file",
        str(ready),
    )
    handle = ProcessHandle(
        name="broker",
        argv=argv,
        env=_env(),
        workdir=workdir,
        ready_file=ready,
        log_path=workdir / "broker.log",
    )
    t0 = time.perf_counter()
    handle.start(timeout=300)
    took = time.perf_counter() - t0
    handle.stop()
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size-mib", type=int, default=1024, help="commit log to write (MiB)")
    p.add_argument("--tail-mib", type=int, default=32, help="appended before the kill -9")
    p.add_argument("--body-bytes", type=int, default=1024)
    p.add_argument("--flush-interval-ms", type=int, default=500)
    p.add_argument("--out", type=Path, default=Path("/tmp/hac-restart"))
    p.add_argument("--cold", action="store_true", help="evict the store from the page cache")
    p.add_argument("--regenerate", action="store_true", help="write the store again")
    args = p.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / "base"
    meta = args.out / "base.json"
    key = {"size_mib": args.size_mib, "body_bytes": args.body_bytes, "segment": SEGMENT}
    result: dict[str, object] = {"size_mib": args.size_mib, "target_s": TARGET_S}
    if args.regenerate or not meta.exists() or json.loads(meta.read_text()) != key:
        shutil.rmtree(base, ignore_errors=True)
        meta.unlink(missing_ok=True)
        t0 = time.perf_counter()
        result["messages"] = int(write(base, args.size_mib * MiB, args.body_bytes, "clean", 0))
        result["generate_s"] = round(time.perf_counter() - t0, 1)
        meta.write_text(json.dumps(key))

    nameserver = run_nameserver(args.out / "ns")
    try:
        cases: dict[str, dict[str, object]] = {}
        for case in ("clean", "kill9", "no_checkpoint"):
            store = args.out / case
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(base, store)
            info: dict[str, object] = {}
            if case == "kill9":
                tail = (args.size_mib + args.tail_mib) * MiB
                said = write(store, tail, args.body_bytes, "kill", args.flush_interval_ms)
                flushed, end = said.split()
                info["unflushed_bytes_at_kill"] = int(end) - int(flushed)
            elif case == "no_checkpoint":
                (store / "checkpoint").unlink()
            info["commitlog_bytes"] = sum(f.stat().st_size for f in (store / "commitlog").iterdir())
            work = args.out / f"{case}-run"
            work.mkdir(exist_ok=True)
            # the store alone, then the broker, each on a fresh copy of the crashed state
            probe = args.out / f"{case}-probe"
            shutil.rmtree(probe, ignore_errors=True)
            shutil.copytree(store, probe)
            if args.cold:
                evict(probe)
            info["store_open_s"], info["recovered_to"] = time_store_open(probe)
            shutil.rmtree(probe)
            if args.cold:
                evict(store)
            took = time_broker_ready(store, nameserver.rpc, work)
            info["broker_ready_s"] = round(took, 2)
            info["ratio_to_target"] = round(took / TARGET_S, 2)
            info["store_open_s"] = round(float(info["store_open_s"]), 3)  # type: ignore[arg-type]
            cases[case] = info
            shutil.rmtree(store)
        result["cases"] = cases
    finally:
        nameserver.stop()
    result["load"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    met = all(
        float(cases[c]["ratio_to_target"]) <= 1.0  # type: ignore[arg-type]
        for c in ("clean", "kill9")
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
