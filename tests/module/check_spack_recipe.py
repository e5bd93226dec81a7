#!/usr/bin/env python3
"""Checks spack/packages/ddp-train/package.py without Spack (none can be installed here).

usage: check_spack_recipe.py SOURCE_DIR

The recipe is imported with a stand-in `spack.package` that records its directives
(version, variant, depends_on, conflicts) and runs cmake_args() for ~cuda, +cuda
cuda_arch=90 and ~cuda with tests on stand-in specs. Checks:
  - the version is project(VERSION) of CMakeLists.txt, the repo.yaml names a namespace;
  - variants cuda and cuda_arch; dependencies mpi, hdf5+mpi, kokkos, onednn (~cuda),
    cmake, and for +cuda: cudnn, nccl and a kokkos+cuda+wrapper per cuda_arch;
  - every option(), cache set() and find_*() result variable of the project's CMake
    files is set by cmake_args() in one of those builds or is listed, with a
    reason, in CMAKE_OPTIONS_NOT_EXPOSED; and every DDP_* name the recipe sets or
    lists is one the CMake files define (no stale names);
  - ~cuda sets DDP_ENABLE_CUDA and DDP_ENABLE_CUDA_GLUE OFF; +cuda sets both ON, the
    Kokkos nvcc_wrapper as the C++ compiler and CMAKE_CUDA_ARCHITECTURES=90.
"""
import contextlib
import importlib.util
import os
import re
import sys
import types

src = sys.argv[1]
recipe_path = os.path.join(src, "spack", "packages", "ddp-train", "package.py")
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


# ---- the project's CMake options: option(), set(... CACHE ...), find_*(VAR ...) -------------
def calls(text, command):
    """(argument text) of each `command(...)` call, parentheses balanced, quotes respected."""
    for m in re.finditer(r"(?<![\w$])" + command + r"\s*\(", text, re.IGNORECASE):
        depth, i, quoted = 1, m.end(), False
        while i < len(text) and depth:
            c = text[i]
            if c == '"' and text[i - 1] != "\\":
                quoted = not quoted
            elif not quoted and c == "(":
                depth += 1
            elif not quoted and c == ")":
                depth -= 1
            i += 1
        yield text[m.end():i - 1]


def cmake_options():
    files = [os.path.join(src, "CMakeLists.txt")]
    for top in ("cmake", "src", "tests", "tools"):
        for root, _, names in os.walk(os.path.join(src, top)):
            files += [os.path.join(root, n) for n in names if n == "CMakeLists.txt" or n.endswith(".cmake")]
    found = {}
    for path in files:
        text = re.sub(r"#[^\n]*", "", open(path).read())  # comments (no '#' inside strings here)
        loops = {a.split()[0]: a.split()[1:] for a in calls(text, "foreach") if a.split()}
        names = []
        names += [a.split()[0] for a in calls(text, "option")]
        names += [a.split()[0] for a in calls(text, "set") if re.search(r"\bCACHE\b", a)]
        # tests/CMakeLists.txt's ddp_find_python(VAR ...) caches VAR
        names += [a.split()[0] for a in calls(text, "ddp_find_python") if a.split()]
        for command in ("find_path", "find_library", "find_program", "find_file"):
            names += [a.split()[0] for a in calls(text, command)]
        for name in names:
            # DDP_${_pkg}_LIBRARY inside foreach(_pkg CUDNN NCCL): one name per loop value
            m = re.search(r"\$\{(\w+)\}", name)
            expanded = [name.replace(m.group(0), v) for v in loops.get(m.group(1), [])] if m else [name]
            for n in expanded:
                if not n.startswith("_") and "$" not in n:  # _private and per-item helper variables
                    found.setdefault(n, os.path.relpath(path, src))
    return found


# ---- a stand-in spack.package ---------------------------------------------------------------
directives = []
_when = []


def _directive(kind):
    def record(*args, **kwargs):
        if _when:
            kwargs["when"] = " ".join(filter(None, _when + [kwargs.get("when", "")]))
        directives.append((kind, args, kwargs))
    return record


class Prefix(str):
    def __getattr__(self, name):
        return Prefix(os.path.join(self, name))


class CMakePackage:
    def __init__(self, spec):
        self.spec = spec
        self.run_tests = False

    def define(self, name, value):
        if isinstance(value, bool):
            return f"-D{name}:BOOL={'ON' if value else 'OFF'}"
        if isinstance(value, (list, tuple)):
            value = ";".join(value)
        return f"-D{name}:STRING={value}"

    def define_from_variant(self, name, variant):
        return self.define(name, self.spec.variants[variant].value)


class CudaPackage:
    cuda_arch_values = ("70", "80", "86", "89", "90")
    variant = _directive("variant")
    variant("cuda", default=False, description="CUDA")
    variant("cuda_arch", values=("none",) + cuda_arch_values, multi=True, when="+cuda")
    depends_on = _directive("depends_on")
    depends_on("cuda", when="+cuda")
    del variant, depends_on


class Variant:
    def __init__(self, value):
        self.value = value


class Dependency:
    def __init__(self, name):
        self.prefix = Prefix("/opt/spack/" + name)
        self.kokkos_cxx = self.prefix + "/bin/nvcc_wrapper"
        self.command = types.SimpleNamespace(path=self.prefix + "/bin/" + name)


class Spec:
    def __init__(self, cuda):
        self.variants = {"cuda": Variant(cuda), "cuda_arch": Variant(("90",) if cuda else ("none",))}

    def __getitem__(self, name):
        return Dependency(name)

    def satisfies(self, constraint):
        return all(self.variants[t[1:]].value == (t[0] == "+") for t in constraint.split())


spack = types.ModuleType("spack")
package = types.ModuleType("spack.package")
for kind in ("version", "variant", "depends_on", "conflicts", "requires", "maintainers", "license"):
    setattr(package, kind, _directive(kind))


@contextlib.contextmanager
def when(condition):
    _when.append(condition)
    yield
    _when.pop()


package.when = when
package.CMakePackage, package.CudaPackage = CMakePackage, CudaPackage
package.find_libraries = lambda name, root, shared=True, recursive=False: [f"{root}/lib/{name}.so"]
package.join_path = os.path.join
package.__all__ = [n for n in vars(package) if not n.startswith("_")]
spack.package = package
sys.modules.update({"spack": spack, "spack.package": package})

# ---- the recipe ---------------------------------------------------------------------------------
spec = importlib.util.spec_from_file_location("ddp_train_recipe", recipe_path)
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)
cls = recipe.DdpTrain
check(issubclass(cls, CMakePackage) and issubclass(cls, CudaPackage), "DdpTrain is a CMakePackage and a CudaPackage")

project_version = re.search(r"project\(ddp_train VERSION ([\d.]+)", open(os.path.join(src, "CMakeLists.txt")).read())
versions = [a[0] for k, a, _ in directives if k == "version"]
check(project_version is not None and project_version.group(1) in versions,
      f"version() {versions} holds the project's {project_version and project_version.group(1)}")
check(re.search(r"^\s+namespace:\s*\w+", open(os.path.join(src, "spack", "repo.yaml")).read(), re.M) is not None,
      "spack/repo.yaml names a namespace")

variants = {a[0] for k, a, _ in directives if k == "variant"}
check({"cuda", "cuda_arch"} <= variants, f"variants {sorted(variants)} include cuda and cuda_arch")
deps = [(a[0], kw.get("when", "")) for k, a, kw in directives if k == "depends_on"]


def depends(pattern, when_pattern=""):
    return any(re.fullmatch(pattern, d) and re.search(when_pattern, w) for d, w in deps)


for pattern, when_pattern, what in [
        (r"mpi", "", "mpi"), (r"hdf5\+mpi", "", "hdf5+mpi"), (r"kokkos(@[\d.:]+)?", "", "kokkos"),
        (r"cmake(@[\d.:]+)?", "", "cmake"), (r"onednn", r"~cuda", "onednn when ~cuda"),
        (r"cudnn", r"\+cuda", "cudnn when +cuda"), (r"nccl", r"\+cuda", "nccl when +cuda"),
        (r"kokkos(@[\d.:]+)?\+cuda\+wrapper cuda_arch=90", r"\+cuda cuda_arch=90",
         "kokkos+cuda+wrapper cuda_arch=90 when +cuda cuda_arch=90"),
        (r"kokkos~cuda", r"~cuda", "kokkos~cuda when ~cuda")]:
    check(depends(pattern, when_pattern), f"depends_on {what}")

# ---- cmake_args against the project's options ------------------------------------------------
args = {}
for cuda, tests in ((False, False), (True, False), (False, True)):
    pkg = cls(Spec(cuda))
    pkg.run_tests = tests
    args[cuda, tests] = dict(re.match(r"-D(\w+):\w+=(.*)", a).groups() for a in pkg.cmake_args())
    print(f"cmake_args {'+' if cuda else '~'}cuda{' --test' if tests else ''}: {args[cuda, tests]}")
args[False], args[True] = args[False, False], args[True, False]
check(args[False].get("DDP_ENABLE_CUDA") == "OFF" and args[False].get("DDP_ENABLE_CUDA_GLUE") == "OFF",
      "~cuda: DDP_ENABLE_CUDA=OFF, DDP_ENABLE_CUDA_GLUE=OFF")
check(args[True].get("DDP_ENABLE_CUDA") == "ON" and args[True].get("DDP_ENABLE_CUDA_GLUE") == "ON",
      "+cuda: DDP_ENABLE_CUDA=ON, DDP_ENABLE_CUDA_GLUE=ON")
check(args[True].get("CMAKE_CXX_COMPILER", "").endswith("nvcc_wrapper"), "+cuda: Kokkos's nvcc_wrapper compiles")
check(args[True].get("CMAKE_CUDA_ARCHITECTURES") == "90", "+cuda cuda_arch=90: CMAKE_CUDA_ARCHITECTURES=90")

options = cmake_options()
print(f"project CMake options ({len(options)}): {', '.join(sorted(options))}")
not_exposed = getattr(recipe, "CMAKE_OPTIONS_NOT_EXPOSED", {})
set_by_recipe = set().union(*args.values())
check(len(options) >= 15, f"{len(options)} options found in the CMake files (the scan works)")
for name, where in sorted(options.items()):
    check(name in set_by_recipe or bool(not_exposed.get(name)),
          f"{name} ({where}) is set by cmake_args or listed with a reason as not exposed")
for name in sorted((set_by_recipe | set(not_exposed)) - set(options)):
    check(not name.startswith("DDP_"), f"{name}, named by the recipe, is an option of the project")

if failures:
    sys.exit(f"FAIL: {len(failures)} check(s)")
print("PASS")
