#!/usr/bin/env python3
"""ctest spack.recipe: the Spack recipe (Spack/spack_repo/zerotrain) agrees with the CMake code.

Read with Python's ast, without Spack:
  - every depends_on names a Spack package that the CMake code really looks for (find_package,
    pkg_check_modules, find_library; mapped to Spack names below), and everything the CMake code
    looks for is a depends_on;
  - every CMake option (option(), set(... CACHE ...) of a ZT_ name) is set by the recipe from a
    variant, or is listed in NOT_EXPOSED with the reason; every define names a variable the CMake
    code reads; every variant is used;
  - the Package API v2 layout (repo.yaml's api, spack_repo/<namespace>/packages/<name>/package.py,
    the v2 imports), language and pkgconfig build dependencies, cuda_arch forwarded to nccl, and
    fetch URLs on no reserved domain.
Then each kind of disagreement is put into a copy (a dependency dropped, one added, an option
added to the CMake code, ...) and must be reported, so that the checks cannot pass by finding
nothing. Prints "PASS: spack recipe" when all holds.

usage: check_recipe.py SOURCE_DIR [--recipe FILE]   (--recipe: check another package.py instead)
"""
import ast
import pathlib
import re
import sys

# What the CMake code looks for -> the Spack package that provides it (None: comes with the
# compiler or CMake itself, no depends_on).
FIND_PACKAGE = {
    "MPI": "mpi",
    "nlohmann_json": "nlohmann-json",
    "OpenMP": None,  # the compiler's runtime
    "Threads": None,
    "BLAS": "blas",
    "dnnl": "onednn",
    # Looked for only when the oneDNN found was built with the OpenCL GPU runtime (Debian's); Spack's
    # onednn builds with gpu_runtime=none by default, so the recipe needs no OpenCL.
    "OpenCL": None,
    "HDF5": "hdf5",
    "PkgConfig": "pkgconfig",
    "CUDAToolkit": "cuda",
    "GTest": "googletest",
    "Python3": "python",  # tests/cuda_on_host translates the CUDA sources (a test build with CUDA)
}
PKG_CONFIG_MODULE = {"libaio": "libaio", "liburing": "liburing"}
FIND_LIBRARY = {"aio": "libaio", "nccl": "nccl", "cblas": "blas"}
# Dependencies that are not found by a find_* call: the languages and the build tool itself.
NOT_FOUND_BY_CMAKE = {"c", "cxx", "fortran", "cmake"}

# CMake options the recipe deliberately does not set, and why.
NOT_EXPOSED = {
    "ZT_WARNINGS_AS_ERRORS": "a developer setting: a new compiler's new warning must not fail an install",
    "ZT_MPIEXEC_EXTRA_FLAGS": "flags for the test launcher on the developer's own machine",
    "ZT_TEST_OPTIMIZATION": "how the test programs' own code is optimized (-O1 for build time); the library follows the build type",
    "ZT_FUZZ_SECONDS": "how long a developer's fuzzing run lasts (bench/fuzz_checkpoint.cmake); nothing installed",
    "ZT_CUDA_ON_HOST": "a check build of the CUDA path on a machine without a GPU (tests/cuda_on_host); never installed",
}
# Options the recipe sets that another branch adds to the CMake code: accepted while absent, and
# checked like any other once they are there.
PENDING: dict[str, str] = {}  # none at present
# Inputs of CMake's own find modules that the recipe may set (module -> find_package it needs).
MODULE_INPUTS = {"MPI_C_COMPILER": "MPI", "MPI_Fortran_COMPILER": "MPI"}

RESERVED_HOSTS = re.compile(
    r"://([^/]*\.)?(example(\.(com|net|org))?|localhost|[^/]*\.(test|invalid|example|localhost))(:\d+)?/"
)

# CMake code that belongs to other projects (examples/consumer is built against an installed
# zerotrain) or is generated.
SKIP_DIRS = {".git", "examples/consumer"}


def spack_name(spec):
    """The package name at the start of a spec string: "hdf5@1.10:+mpi" -> "hdf5"."""
    return re.match(r"[A-Za-z0-9_.-]*", spec.strip()).group(0).split("@")[0]


def string_of(node):
    """A string constant, or the constant text before the first {} of an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        text = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += part.value
            else:
                return text + "{}"
        return text
    return None


def call_name(node):
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def keyword(node, name):
    for kw in node.keywords:
        if kw.arg == name:
            return string_of(kw.value) if not isinstance(kw.value, ast.Tuple) else kw.value
    return None


class Recipe:
    def __init__(self, text):
        self.tree = ast.parse(text)
        self.imports = {}
        self.cls = None
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    self.imports[alias.name] = node.module
            if isinstance(node, ast.ClassDef):
                self.cls = node
        if self.cls is None:
            raise ValueError("no package class in the recipe")
        self.bases = [b.id for b in self.cls.bases if isinstance(b, ast.Name)]
        self.depends = []  # (name, spec, when, type, inside a loop over cuda_arch_values)
        self.variants = {}
        self.whens = []
        self.attributes = {}
        self.versions = []
        self.defines = {}  # CMake variable -> the call's text
        self.cmake_args_strings = []
        self._walk(self.cls.body, loop=None)

    def _walk(self, body, loop):
        for node in body:
            if isinstance(node, ast.For):
                self._walk(node.body, loop=ast.unparse(node.iter))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.attributes[target.id] = node.value
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                self._directive(node.value, loop)
            elif isinstance(node, ast.FunctionDef) and node.name == "cmake_args":
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Call) and call_name(sub) in ("define", "define_from_variant"):
                        variable = string_of(sub.args[0]) if sub.args else None
                        if variable:
                            self.defines[variable] = ast.unparse(sub)
                    text = string_of(sub) if isinstance(sub, (ast.Constant, ast.JoinedStr)) else None
                    if text is not None:
                        self.cmake_args_strings.append(text)

    def _directive(self, call, loop):
        name = call_name(call)
        first = string_of(call.args[0]) if call.args else None
        when = keyword(call, "when")
        if isinstance(when, str):
            self.whens.append(when)
        if name == "depends_on" and first is not None:
            types = keyword(call, "type")
            if isinstance(types, ast.Tuple):
                types = tuple(string_of(e) for e in types.elts)
            self.depends.append((spack_name(first), first, when, types, loop))
        elif name == "variant" and first is not None:
            self.variants[first] = call
        elif name in ("conflicts", "requires") and first is not None:
            self.whens.append(first)
        elif name == "version" and first is not None:
            self.versions.append((first, {kw.arg: string_of(kw.value) for kw in call.keywords}))

    def depends_names(self):
        return {name for name, *_ in self.depends}

    def variant_used(self, variant):
        mark = re.compile(r"(^|[\s+~])[+~]" + re.escape(variant) + r"(\b|$)")
        if any(mark.search(w) for w in self.whens):
            return True
        return any(s == variant or mark.search(s) for s in self.cmake_args_strings)


class CMakeCode:
    COMMAND = re.compile(r"\b(find_package|pkg_check_modules|find_library|find_path|option|set)\s*\(([^)]*)\)", re.S)

    def __init__(self, files):
        self.files = files  # relative path -> text
        self.found = []  # (kind, name, where)
        self.options = {}  # option -> where
        self.find_variables = set()
        for path, text in files.items():
            stripped = re.sub(r"#[^\n]*", "", text)
            for match in self.COMMAND.finditer(stripped):
                command, arguments = match.group(1), match.group(2).split()
                where = f"{path}:{stripped.count(chr(10), 0, match.start()) + 1}"
                if not arguments:
                    continue
                if command == "find_package":
                    self.found.append(("find_package", arguments[0], where))
                elif command == "pkg_check_modules":
                    keywords = {"REQUIRED", "QUIET", "NO_CMAKE_PATH", "NO_CMAKE_ENVIRONMENT_PATH", "IMPORTED_TARGET", "GLOBAL"}
                    for module in arguments[1:]:
                        if module not in keywords:
                            self.found.append(("pkg_check_modules", re.split(r"[<>=]", module)[0], where))
                elif command in ("find_library", "find_path"):
                    self.find_variables.add(arguments[0])
                    if command == "find_library":
                        names = arguments[2:] if arguments[1] == "NAMES" else arguments[1:2]
                        for library in names:
                            if library.isupper():
                                break
                            self.found.append(("find_library", library, where))
                elif command == "option" and arguments[0].startswith("ZT_"):
                    self.options[arguments[0]] = where
                elif (command == "set" and arguments[0].startswith("ZT_") and "CACHE" in arguments
                      and "INTERNAL" not in arguments):  # INTERNAL: the build's own, not an option
                    self.options[arguments[0]] = where

    def mentions(self, variable):
        return any(re.search(r"\b" + re.escape(variable) + r"\b", t) for t in self.files.values())


def cmake_files(source_dir):
    files = {}
    for path in sorted(source_dir.rglob("*")):
        relative = path.relative_to(source_dir).as_posix()
        if any(relative == d or relative.startswith(d + "/") for d in SKIP_DIRS):
            continue
        if relative.split("/")[0].startswith("build"):  # build trees
            continue
        if path.name == "CMakeLists.txt" or path.suffix == ".cmake":
            files[relative] = path.read_text()
    return files


def check(recipe_text, recipe_path, repo_yaml, files):
    """Every disagreement between the recipe and the CMake code, as sentences."""
    problems = []
    recipe = Recipe(recipe_text)
    cmake = CMakeCode(files)

    # Package API v2: the layout, repo.yaml's api, the imports.
    parts = pathlib.PurePosixPath(recipe_path).parts
    if len(parts) < 5 or parts[-5] != "spack_repo" or parts[-3] != "packages" or parts[-1] != "package.py":
        problems.append(f"{recipe_path}: not at spack_repo/<namespace>/packages/<name>/package.py")
    else:
        namespace, package = parts[-4], parts[-2]
        if not re.search(r"^\s*namespace:\s*" + re.escape(namespace) + r"\s*$", repo_yaml, re.M):
            problems.append(f"repo.yaml: namespace is not '{namespace}', the directory's name")
        if recipe.cls.name != "".join(p.capitalize() for p in package.split("_")):
            problems.append(f"class {recipe.cls.name} does not match the package directory '{package}'")
    if not re.search(r"^\s*api:\s*v2\.\d+\s*$", repo_yaml, re.M):
        problems.append("repo.yaml: no 'api: v2.N' (Package API v2, Spack v1.0 and later)")
    for base, module in (("CMakePackage", "spack_repo.builtin.build_systems.cmake"),
                         ("CudaPackage", "spack_repo.builtin.build_systems.cuda")):
        if base not in recipe.bases:
            problems.append(f"the package class does not derive from {base}")
        elif recipe.imports.get(base) != module:
            problems.append(f"{base} is not imported from {module} (Package API v2)")
    if "*" not in recipe.imports or recipe.imports["*"] != "spack.package":
        problems.append("no 'from spack.package import *'")

    # Build dependencies on the languages and the tools.
    depends = {name: (spec, when, types) for name, spec, when, types, _ in recipe.depends}
    for language, when in (("c", None), ("cxx", None), ("fortran", "+fortran")):
        entry = depends.get(language)
        if entry is None or entry[2] != "build" or entry[1] != when:
            problems.append(f'no depends_on("{language}", type="build"' + (f', when="{when}")' if when else ")"))
    for tool in ("cmake", "pkgconfig"):
        entry = depends.get(tool)
        if entry is None or entry[2] != "build":
            problems.append(f'no depends_on("{tool}...", type="build")')

    # Dependencies against what the CMake code finds.
    wanted = {}
    for kind, name, where in cmake.found:
        table = {"find_package": FIND_PACKAGE, "pkg_check_modules": PKG_CONFIG_MODULE, "find_library": FIND_LIBRARY}[kind]
        if name == "zerotrain":
            continue
        if name not in table:
            problems.append(f"{where}: {kind}({name}) has no Spack name in tests/spack/check_recipe.py: "
                            "add it there and a depends_on to the recipe")
        elif table[name] is not None:
            wanted.setdefault(table[name], where)
    for name in sorted(recipe.depends_names() - NOT_FOUND_BY_CMAKE):
        if name not in wanted:
            problems.append(f'depends_on("{name}"): nothing in the CMake code finds {name}')
    for name, where in sorted(wanted.items()):
        if name not in recipe.depends_names():
            problems.append(f"{where}: the CMake code finds {name} but the recipe has no depends_on(\"{name}\")")

    # cuda_arch forwarded to nccl.
    forwarded = [spec for name, spec, when, _, loop in recipe.depends
                 if name == "nccl" and loop == "CudaPackage.cuda_arch_values"
                 and "cuda_arch={}" in spec and when == "+cuda cuda_arch={}"]
    if not forwarded:
        problems.append("cuda_arch is not forwarded to nccl (a loop over CudaPackage.cuda_arch_values)")

    # Options and variants.
    for option, where in sorted(cmake.options.items()):
        if option in NOT_EXPOSED:
            continue
        if option not in recipe.defines:
            problems.append(f"{where}: CMake option {option} is neither set by the recipe from a variant "
                            "nor listed in NOT_EXPOSED with a reason")
    for option in NOT_EXPOSED:
        if option not in cmake.options:
            problems.append(f"NOT_EXPOSED lists {option}, which the CMake code no longer has")
        elif option in recipe.defines:
            problems.append(f"NOT_EXPOSED lists {option}, but the recipe sets it")
    for variable in sorted(recipe.defines):
        if variable in cmake.options or variable in cmake.find_variables:
            continue
        if variable in PENDING and variable.startswith("ZT_"):
            continue
        if variable in MODULE_INPUTS and any(n == MODULE_INPUTS[variable] for _, n, _ in cmake.found):
            continue
        if not variable.startswith("ZT_") and cmake.mentions(variable):
            continue
        problems.append(f"the recipe sets {variable}, which the CMake code does not read")
    for variant in sorted(recipe.variants):
        if not recipe.variant_used(variant):
            problems.append(f'variant("{variant}") changes nothing (no when=, not read in cmake_args)')

    # Versions and where they come from.
    fetch_urls = {}
    for attribute in ("url", "git", "homepage"):
        value = recipe.attributes.get(attribute)
        if value is not None:
            fetch_urls[attribute] = string_of(value) or ""
    for attribute, url in fetch_urls.items():
        if RESERVED_HOSTS.search(url) or not url.startswith("https://"):
            problems.append(f"{attribute} = {url!r}: not a real https URL (a reserved domain cannot be fetched)")
    for version, args in recipe.versions:
        if "sha256" in args:
            if not re.fullmatch(r"[0-9a-f]{64}", args["sha256"] or ""):
                problems.append(f"version {version}: sha256 is not 64 hex digits")
            if "url" not in fetch_urls and "url" not in args:
                problems.append(f"version {version} has a sha256 but the recipe has no url to fetch it from")
        elif "branch" in args or "tag" in args or "commit" in args:
            pass
        else:
            problems.append(f"version {version}: neither a sha256 nor a git branch, tag or commit")
    return problems


def mutations(recipe_text, files):
    """(what, recipe text, cmake files, a problem that must then be reported)."""
    def cmake_with(extra):
        changed = dict(files)
        changed["CMakeLists.txt"] = changed["CMakeLists.txt"] + "\n" + extra + "\n"
        return changed

    def drop(line):
        assert line in recipe_text, f"mutation: the recipe has no line {line!r}"
        return recipe_text.replace(line, "", 1)

    yield ("libaio dependency dropped", drop('    depends_on("libaio")\n'), files,
           'the CMake code finds libaio but the recipe has no depends_on("libaio")')
    yield ("a dependency nothing finds", recipe_text.replace('depends_on("libaio")\n', 'depends_on("libaio")\n    depends_on("zlib")\n', 1),
           files, 'depends_on("zlib"): nothing in the CMake code finds zlib')
    yield ("a new CMake option", recipe_text, cmake_with('option(ZT_WITH_NEW_THING "x" OFF)'),
           "CMake option ZT_WITH_NEW_THING is neither set")
    yield ("a new find_package", recipe_text, cmake_with("find_package(Kokkos REQUIRED)"),
           "find_package(Kokkos) has no Spack name")
    yield ("uring not passed on", drop('            self.define("ZT_WITH_URING", on_off("uring")),\n'), files,
           "CMake option ZT_WITH_URING is neither set")
    yield ("a define CMake never reads", recipe_text.replace('self.define_from_variant("ZT_BUILD_BENCH", "benchmarks"),',
                                                             'self.define_from_variant("ZT_BUILD_BENCH", "benchmarks"),\n            self.define("ZT_UNHEARD_OF", "ON"),', 1),
           files, "the recipe sets ZT_UNHEARD_OF, which the CMake code does not read")
    yield ("a reserved domain", recipe_text.replace('    maintainers(', '    git = "https://zerotrain.example/zerotrain.git"\n    maintainers(', 1),
           files, "not a real https URL")
    yield ("nccl without cuda_arch", recipe_text.replace("cuda_arch={_arch}\", when", "\", when", 1), files,
           "cuda_arch is not forwarded to nccl")
    yield ("no pkgconfig", drop('    depends_on("pkgconfig", type="build")\n'), files,
           "the CMake code finds pkgconfig but the recipe has no depends_on")


def main():
    source_dir = pathlib.Path(sys.argv[1]).resolve()
    repo_dir = source_dir / "Spack" / "spack_repo" / "zerotrain"
    recipe_path = repo_dir / "packages" / "zerotrain" / "package.py"
    if "--recipe" in sys.argv:
        recipe_path = pathlib.Path(sys.argv[sys.argv.index("--recipe") + 1]).resolve()
        relative = "Spack/spack_repo/zerotrain/packages/zerotrain/package.py"
    else:
        relative = recipe_path.relative_to(source_dir).as_posix()
    recipe_text = recipe_path.read_text()
    repo_yaml = (repo_dir / "repo.yaml").read_text()
    files = cmake_files(source_dir)

    problems = check(recipe_text, relative, repo_yaml, files)
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        return 1
    recipe = Recipe(recipe_text)
    cmake = CMakeCode(files)
    print(f"recipe: {len(recipe.depends)} depends_on, variants {sorted(recipe.variants)}, "
          f"CMake options {sorted(cmake.options)} (not exposed: {sorted(NOT_EXPOSED)})")
    if "--recipe" not in sys.argv:
        for what, text, changed_files, expected in mutations(recipe_text, files):
            found = check(text, relative, repo_yaml, changed_files)
            if not any(expected in p for p in found):
                print(f"FAIL: mutation '{what}' was not reported (expected '{expected}'; got {found})")
                return 1
        print("mutations: each disagreement put into a copy was reported")
    print("PASS: spack recipe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
