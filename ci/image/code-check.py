"""Check that the baked-in code can start: it compiles, and every package it imports at module level is installed.

Run by the Dockerfile after `COPY entrypoint/ recipes/` (as `python3 tools/code-check.py entrypoint recipes`):
a recipes/ module that starts importing a package missing from requirements.lock fails the build here, in
well under a second, instead of in the first training run. Only top-level names are looked up, with
importlib.util.find_spec, which imports nothing; imports inside functions or try blocks (Neuron-only
modules such as torch_neuronx) are left to run time. The full import of the recipes is exercised by the
CI container runs (ci/smoke.py), and the packages' own imports by import-check.py at install time.
"""

import ast
import importlib.util
import sys
from pathlib import Path


def module_level_imports(tree):
    for node in tree.body:  # module level only: not in functions, classes, try or if blocks
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def main(roots):
    local = {path.name for root in roots for path in Path(root).iterdir() if (path / "__init__.py").exists()}
    local |= {Path(root).name for root in roots}
    missing, files = [], 0
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            files += 1
            try:
                tree = ast.parse(path.read_text(), str(path))
            except SyntaxError as error:
                missing.append(f"{path}: {error}")
                continue
            for name in sorted(set(module_level_imports(tree))):
                if name in sys.stdlib_module_names or name in local:
                    continue
                if importlib.util.find_spec(name) is None:
                    missing.append(f"{path}: imports {name}, which is not installed")
    if missing:
        print("code-check: FAILED\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    print(f"code-check: {files} files in {', '.join(roots)} compile; their module-level imports are installed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
