"""How long `--weights gpt2` takes to say that it cannot get the file, with no network.

Runs `theinference test --weights gpt2` in a fresh Hugging Face cache, three ways: this
machine's own network (none, on a machine without one), a Hub endpoint whose port refuses
connections, and HF_HUB_OFFLINE=1. Prints each run's wall time (command start to exit, Python
and imports included), the time the weights lookup itself took, its exit code, whether any line
of the hub client's retry log reached stderr, and the grader's message.

    python benchmarks/offline_weights.py
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import make_course  # noqa: E402

LOOKUP = """
import sys, time
from theinference.oracle.weights import WeightsError, download_gpt2
started = time.monotonic()
try:
    download_gpt2()
except WeightsError:
    pass
print(f"{time.monotonic() - started:.2f}", file=sys.stderr)
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: connections are refused


def run(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    return time.monotonic() - started, done


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        course = make_course(Path(tmp) / "course")
        base = {**os.environ, "HF_HOME": str(Path(tmp) / "hf"), "NO_COLOR": "1"}
        ways = {
            "this machine's network": {},
            "a refusing endpoint": {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"},
            "HF_HUB_OFFLINE=1": {"HF_HUB_OFFLINE": "1"},
        }
        for label, extra in ways.items():
            env = {**base, **extra}
            command = [sys.executable, "-m", "theinference", "test", "-C", str(course)]
            wall, done = run([*command, "--weights", "gpt2"], env)
            _, lookup = run([sys.executable, "-c", LOOKUP], env)
            retries = "Retry" in done.stderr or "thrown while requesting" in done.stderr
            message = " ".join(done.stderr.split())[:160]
            print(f"{label}: {wall:.2f} s wall, lookup {lookup.stderr.strip()} s, "
                  f"exit {done.returncode}, retry log: {'yes' if retries else 'no'}\n  {message}")


if __name__ == "__main__":
    main()
