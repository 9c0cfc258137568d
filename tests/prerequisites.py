"""What `make test` needs from the machine beyond Python: checked first, one line per thing missing.

Runs with the system Python before the virtualenv exists (standard library only), so a missing
JDK fails the run in a second instead of deep inside the Spark tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

MIN_PYTHON = (3, 11)
MIN_JAVA = 17


def _java() -> str | None:
    if shutil.which("java") is None:
        return f"Java {MIN_JAVA}+ (no `java` on PATH), for the Spark tests of `pinmq check`"
    try:
        out = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=60
        ).stderr
    except (OSError, subprocess.SubprocessError) as err:
        return f"Java {MIN_JAVA}+ (`java -version` failed: {err})"
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if found is None:
        return f"Java {MIN_JAVA}+ (cannot read the version from `java -version`)"
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0_372" style
        major = int(found.group(2))
    if major < MIN_JAVA:
        return f"Java {MIN_JAVA}+ (found Java {major}), for the Spark tests of `pinmq check`"
    return None


def _namespaces() -> str | None:
    """The README tour test runs the cluster in a private network namespace of its own."""
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (util-linux, iproute2), for the README tour test"
    probe = ["unshare", "--net", "--map-root-user", "ip", "link", "set", "lo", "up"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"a private network namespace (`unshare --net` failed: {err})"
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no reason"
        return f"a private network namespace for the README tour test (`unshare --net`: {reason})"
    return None


def _browser() -> str | None:
    """The console's browser test drives Debian's Chromium with its own driver."""
    missing = [tool for tool in ("chromium", "chromedriver") if shutil.which(tool) is None]
    if missing:
        return (
            f"{' and '.join(missing)} (apt-get install chromium chromium-driver), for the "
            "console's browser test"
        )
    return None


def _disks() -> str | None:
    """The chaos run gives each container a small loop-mounted disk that it fills."""
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (e2fsprogs, mount), for the chaos run's disks"
    if os.geteuid() != 0:
        return "root, to loop-mount the chaos run's disks (tests/disk_images.py)"
    return None


def missing() -> list[str]:
    found: list[str] = []
    if sys.version_info < MIN_PYTHON:
        found.append(f"Python {'.'.join(map(str, MIN_PYTHON))}+ (this is {sys.version.split()[0]})")
    for check in (_java, _namespaces, _browser, _disks):
        if (problem := check()) is not None:
            found.append(problem)
    return found


def main() -> int:
    problems = missing()
    for problem in problems:
        print(f"make test: missing {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
