"""`python bench/profile.py`: where a persistent grouped message's microseconds go in the node
(the code and its options: bench/node_profile.py).

Python puts a script's directory first on its module path, so for every script in bench/ this
file is also what `import profile` finds, before the standard library's module of that name
(cProfile imports it, and PySpark imports cProfile). Imported, it therefore becomes that
module, and only run as a script does it profile the node.
"""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

if __name__ == "__main__":
    from node_profile import main

    main()
else:
    _spec = importlib.util.spec_from_file_location(
        __name__, Path(sysconfig.get_path("stdlib")) / "profile.py"
    )
    assert _spec is not None and _spec.loader is not None
    _standard = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_standard)
    globals().update({k: v for k, v in vars(_standard).items() if not k.startswith("__")})
