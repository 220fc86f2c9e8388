"""``scripts/kafka.sh`` driven from Python: one private Apache Kafka broker on a port and data
dir of the caller's.

Standard library only (no pytest, no Django, no Kafka client), so the Kafka suite's fixtures,
the fault suite and the bench (``bench/harness.py``) share it.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO_ROOT / "scripts" / "kafka.sh"


class KafkaBroker:
    """``scripts/kafka.sh`` on one port and data dir (topics are never auto-created)."""

    def __init__(self, port: int, data_dir: str) -> None:
        self.port = port
        self.data_dir = data_dir
        self.bootstrap = f"127.0.0.1:{port}"
        self.env = {**os.environ, "JOBS_KAFKA_PORT": str(port), "JOBS_KAFKA_DIR": data_dir,
                    "JOBS_KAFKA_AUTO_CREATE": "false"}

    def script(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run([str(KAFKA_SH), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"kafka.sh {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> None:
        self.script("start")

    def running(self) -> bool:
        """Whether the broker runs and is not paused (``status`` is cheap)."""
        done = subprocess.run([str(KAFKA_SH), "status"], env=self.env, capture_output=True,
                              text=True, timeout=30)
        return done.stdout.startswith("running:")

    def ensure_running(self) -> None:
        """Start or resume the broker unless it already runs (a ``start`` on a running
        broker still waits for a metadata answer)."""
        if not self.running():
            self.start()

    def stop(self) -> None:
        self.script("stop")

    def pause(self) -> None:
        self.script("pause")

    def resume(self) -> None:
        self.script("resume")

    def create_topic(self, name: str, partitions: int = 1,
                     configs: dict[str, str] | None = None) -> None:
        args = ["topics", "--create", "--if-not-exists", "--topic", name,
                "--partitions", str(partitions), "--replication-factor", "1"]
        for key, value in (configs or {}).items():
            args += ["--config", f"{key}={value}"]
        self.script(*args, timeout=60)

    def create_topics(self, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
        with ThreadPoolExecutor(max_workers=len(topics)) as pool:
            for future in [pool.submit(self.create_topic, name, partitions, configs)
                           for name, (partitions, configs) in topics.items()]:
                future.result()
