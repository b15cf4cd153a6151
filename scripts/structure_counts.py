"""Structure counts of the code (issue 23's before/after): functions with more than 6 parameters (self/cls not
counted), `dict[str, Any]` and `.get("` outside the stdlib supervisor, function-level imports (all, and in cli/),
lines matching '"kind"' or '.get("signature")', and `Event(` constructions.

Usage: python scripts/structure_counts.py [ROOT]   (ROOT: a checkout, default this one; git must be on PATH)"""
import ast, sys, pathlib, re, subprocess
root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
pkg = root / "deployer"
many = fl_imports = fl_cli = 0
dict_any = 0
for path in pkg.rglob("*.py"):
    text = path.read_text()
    sup = "supervisor" in path.parts
    if not sup:
        dict_any += text.count("dict[str, Any]")
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (1 if a.vararg else 0) + (1 if a.kwarg else 0)
            if a.args and a.args[0].arg in ("self", "cls"):
                n -= 1
            if n > 6:
                many += 1
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    fl_imports += 1
                    if "cli" in path.parts:
                        fl_cli += 1
g = lambda pat: len(subprocess.run(["git", "grep", "-n", pat, "--", "deployer"], cwd=root, capture_output=True, text=True).stdout.splitlines())
print(f"functions >6 params: {many}")
print(f"dict[str, Any] outside supervisor: {dict_any}")
print(f"function-level imports: {fl_imports} (cli/: {fl_cli})")
KPAT = '"kind"\\|\\.get("signature")'
print('"kind" or .get("signature") lines:', g(KPAT))
print(f'.get(" outside supervisor: ' + str(sum(p.read_text().count('.get("') for p in pkg.rglob("*.py") if "supervisor" not in p.parts)))
print(f"Event( constructions: {g('Event(')}")
