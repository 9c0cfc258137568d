"""Install (if missing) and run Debian's ActiveMQ Classic 5.17 privately on loopback.

The broker gets its own base/conf/data directories under a temp dir and exactly one transport
connector, `stomp://127.0.0.1:<free port>`; everything else is Debian's instance config
(`/etc/activemq/instances-available/main/activemq.xml`: KahaDB, JMX off) and its launcher's
JVM flags (`/usr/bin/activemq`, `/usr/share/activemq/activemq-options`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.procs import reserve_port, spawn, stop

from stomp_load.ready import wait_stomp

HOME = Path("/usr/share/activemq")
JAR = HOME / "bin" / "activemq.jar"
DEBIAN_XML = Path("/etc/activemq/instances-available/main/activemq.xml")
START_TIMEOUT_S = 90.0
# From Debian's activemq-options (ACTIVEMQ_OPTS) and /usr/bin/activemq (Java > 8 branch).
MEMORY_OPTS = ["-Xms512M", "-Xmx512M", "-Dorg.apache.activemq.UseDedicatedTaskRunner=true"]
MODULE_OPTS = [
    "--add-reads=java.xml=java.logging",
    *(
        f"--add-opens={m}=ALL-UNNAMED"
        for m in (
            "java.base/java.security",
            "java.base/java.net",
            "java.base/java.lang",
            "java.base/java.util",
            "java.naming/javax.naming.spi",
            "java.rmi/sun.rmi.transport.tcp",
            "java.base/java.util.concurrent",
            "java.base/java.util.concurrent.atomic",
        )
    ),
    *(
        f"--add-exports={m}=ALL-UNNAMED"
        for m in (
            "java.base/sun.net.www.protocol.http",
            "java.base/sun.net.www.protocol.https",
            "java.base/sun.net.www.protocol.jar",
            "jdk.xml.dom/org.w3c.dom.html",
            "jdk.naming.rmi/com.sun.jndi.url.rmi",
        )
    ),
]
LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${activemq.data}/activemq.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d %-5p %c{1} - %m%n
"""


@dataclass(frozen=True, slots=True)
class Running:
    """A started broker: where its STOMP connector listens and what it runs with."""

    host: str
    port: int
    pid: int
    settings: str
    started_s: float


def ensure_installed() -> str:
    """Install Debian's `activemq` package when its jar is missing; return its version."""
    if not JAR.exists():
        if os.geteuid() != 0:
            raise RuntimeError("activemq is not installed and this is not root: apt-get it first")
        print("activemq not installed: apt-get install -y activemq", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "activemq"]
        if subprocess.run(cmd, env=env, timeout=600, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, timeout=600, check=True)
            subprocess.run(cmd, env=env, timeout=600, check=True)
    if shutil.which("java") is None:
        raise RuntimeError("no java on PATH (the activemq package depends on a JRE)")
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "activemq"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.stdout.strip() or "unknown"


def _config(port: int) -> str:
    """Debian's instance config with its connectors replaced by one loopback STOMP connector."""
    xml = DEBIAN_XML.read_text()
    start = xml.index("<transportConnectors>")
    end = xml.index("</transportConnectors>") + len("</transportConnectors>")
    connector = (
        "<transportConnectors>\n"
        f'            <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>\n'
        "        </transportConnectors>"
    )
    return xml[:start] + connector + xml[end:]


@contextmanager
def running_activemq(workdir: Path) -> Iterator[Running]:
    """ActiveMQ with base/conf/data under `workdir`; SIGTERM (then SIGKILL) on exit."""
    base, conf, data, tmp = (workdir / d for d in ("base", "conf", "data", "tmp"))
    for d in (base, conf, data, tmp):
        d.mkdir(parents=True, exist_ok=True)
    port = reserve_port()
    (conf / "activemq.xml").write_text(_config(port))
    (conf / "log4j.properties").write_text(LOG4J)
    cmd = [
        "java",
        *MEMORY_OPTS,
        *MODULE_OPTS,
        f"-Djava.io.tmpdir={tmp}",
        f"-Dactivemq.home={HOME}",
        f"-Dactivemq.base={base}",
        f"-Dactivemq.conf={conf}",
        f"-Dactivemq.data={data}",
        f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
        "-jar",
        str(JAR),
        "start",
        f"xbean:file:{conf / 'activemq.xml'}",
    ]
    log_path = workdir / "activemq.out"
    with log_path.open("ab") as log:
        proc = spawn(cmd, log, cwd=base)
    try:
        took = wait_stomp("127.0.0.1", port, proc, log_path, START_TIMEOUT_S, "ActiveMQ")
        settings = (
            f"ActiveMQ {ensure_installed()} defaults (Debian instance config: KahaDB, JMX off), "
            f"connector stomp://127.0.0.1:{port}, {' '.join(MEMORY_OPTS)}; "
            "no destination policy: timeBeforeDispatchStarts/consumersBeforeDispatchStarts unset"
        )
        yield Running("127.0.0.1", port, proc.pid, settings, took)
    finally:
        stop(proc, grace=20.0)
