#!/usr/bin/env python3.11
"""Regenerate rules/torchtpu-ops.json: which aten operators TorchTPU can run.

    python3.11 tools/op_coverage/regenerate.py [--venv DIR] [--keep] [--out FILE]

A maintainer runs this by hand when the pinned torch-tpu release changes. It
builds a venv of about 2 GB (torch, torch-tpu and libtpu wheels), so it must
never run in tests or CI: it refuses to start when $CI is set or under pytest.
It does the following:

1. Makes a throwaway virtualenv (default: a new directory under /tmp, deleted
   at the end unless --keep is given) and runs
   `pip install torch==2.13.0 torch-tpu==0.2.0` in it. It never touches the
   project's own .venv. If --venv names an existing venv that already holds
   those versions, it is reused and never deleted.
2. Compiles tools/op_coverage/fake_libtpu.c with gcc. That stub exports a
   GetPjrtApi() returning an empty PJRT table. With TPU_LIBRARY_PATH pointing
   at it, `import torch_tpu` finishes on a machine without a TPU (see the .c
   file for why that is needed).
3. Runs a child interpreter of that venv. The child snapshots torch's aten
   operator registry before TorchTPU loads, imports torch_tpu, and asks the
   dispatcher, for every aten op, whether it has a PrivateUse1 kernel (TorchTPU
   registered one) or a CompositeExplicitAutograd[NonFunctional] /
   CompositeImplicitAutograd kernel. It also checks for a PrivateUse1 boxed
   fallback and probes what that fallback does. No tensor is ever placed on
   the (absent) device. A structured op whose .out delegate comes out "none"
   is marked "none" too, unless --literal-precedence is given (see README).
4. Writes the table, one op per line and sorted, so that diffs stay reviewable.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TORCH_VERSION = "2.13.0"
TORCH_TPU_VERSION = "0.2.0"

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STUB_SRC = HERE / "fake_libtpu.c"
DEFAULT_OUT = REPO / "rules" / "torchtpu-ops.json"
GENERATOR = "tools/op_coverage/regenerate.py"

# Value precedence, highest first (see tools/op_coverage/README.md).
CATEGORIES = ("device", "composite-explicit", "composite-implicit", "none")

# --------------------------------------------------------------------------
# Code run by the child interpreter (inside the throwaway venv).
# argv[1] = path of the JSON result file to write.
# The parent sets TPU_LIBRARY_PATH=<stub> and TORCH_DEVICE_BACKEND_AUTOLOAD=0,
# so `import torch` gives the plain torch registry first.
# --------------------------------------------------------------------------
CHILD = r'''
import json, os, re, sys, tempfile
import importlib.metadata as md

out_path = sys.argv[1]
literal = len(sys.argv) > 2 and sys.argv[2] == "--literal-precedence"
import torch
C = torch._C

def aten_names():
    return {n for n in C._dispatch_get_all_op_names() if n.startswith("aten::")}

# 1. torch's own aten registry, before TorchTPU is loaded.
torch_ops = aten_names()
# Cross-check the registry against the JIT schema list (same registry, other API).
schema_ops = set()
for s in C._jit_get_all_schemas():
    if s.name.startswith("aten::"):
        schema_ops.add(s.name + ("." + s.overload_name if s.overload_name else ""))

# 2. Load TorchTPU the way autoload does.
import torch_tpu
import torch_tpu._loader
torch_tpu._loader.load()
stub = os.environ.get("TPU_LIBRARY_PATH")

pu1 = set(C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"))
apu1 = set(C._dispatch_get_registrations_for_dispatch_key("AutogradPrivateUse1"))
after_ops = aten_names()

def has(name, key):
    return C._dispatch_has_kernel_for_dispatch_key(name, key)

def computed_pu1(name):
    """(site, kind) of the kernel the PrivateUse1 slot resolves to."""
    for line in C._dispatch_dump_table(name).splitlines():
        if line.startswith("PrivateUse1:"):
            m = re.search(r"registered at (\S+) \[(.*)\]", line)
            return (m.group(1), m.group(2)) if m else (line, "?")
    return (None, None)

def site_of(name, key):
    for line in C._dispatch_dump(name).splitlines():
        if line.startswith(key + ":"):
            m = re.search(r"registered at (\S+)", line)
            return m.group(1) if m else line
    return None

ops = {}
flags = {}
mismatch = []
device_sites = {}
for name in sorted(torch_ops):
    cea = has(name, "CompositeExplicitAutograd")
    ceanf = has(name, "CompositeExplicitAutogradNonFunctional")
    cia = has(name, "CompositeImplicitAutograd")
    if name in pu1:
        cat = "device"
        s = site_of(name, "PrivateUse1")
        device_sites[s] = device_sites.get(s, 0) + 1
    elif cea or ceanf:
        cat = "composite-explicit"
    elif cia:
        cat = "composite-implicit"
    else:
        cat = "none"
    ops[name] = cat
    flags[name] = {"cea": cea, "ceanf": ceanf, "cia": cia,
                   "autograd_pu1": name in apu1}
    # Self-check against the dispatcher's computed table.
    site, kind = computed_pu1(name)
    expect = {"device": "kernel", "composite-explicit": "default backend kernel",
              "composite-implicit": "math kernel", "none": "backend fallback"}[cat]
    if kind != expect:
        mismatch.append([name, cat, kind, site])

# 2b. Structured ops: PyTorch's generated CompositeExplicitAutogradNonFunctional
# kernel for a functional/in-place structured op (e.g. aten::erfc) only wraps a
# call to its `structured_delegate` (aten::erfc.out). If the delegate has no
# TPU kernel, the op ends in the fallback just the same, so it is "none".
import torchgen
nf_path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native",
                       "native_functions.yaml")
delegates = {}
current = None
for line in open(nf_path):
    m = re.match(r"- func:\s*([\w.]+)\(", line)
    if m:
        current = m.group(1)
        continue
    m = re.match(r"\s+structured_delegate:\s*([\w.]+)", line)
    if m and current:
        delegates[current] = m.group(1)
downgraded = []
for name, delegate in sorted(delegates.items()):
    key, dkey = "aten::" + name, "aten::" + delegate
    if ops.get(key) == "composite-explicit" and ops.get(dkey) == "none":
        downgraded.append([key, dkey])
        if not literal:
            ops[key] = "none"

# 3. The PrivateUse1 boxed fallback: registered? where? what does it do?
DK = C.DispatchKey
fallback = {"registered": bool(C._dispatch_has_backend_fallback(DK.PrivateUse1))}
for k in ("AutogradPrivateUse1", "AutocastPrivateUse1", "SparsePrivateUse1"):
    fallback[k] = bool(C._dispatch_has_backend_fallback(getattr(DK, k)))
none_ops = [n for n, c in ops.items() if c == "none"]
if fallback["registered"] and none_ops:
    fallback["site"] = computed_pu1("aten::linalg_eig" if "aten::linalg_eig" in none_ops else none_ops[0])[0]

probe = {}
try:
    from torch_tpu._internal import execution_mode as em
    probe["enable_cpu_fallback_default"] = bool(em.enable_cpu_fallback)
    if "aten::linalg_eig" in none_ops:
        class W(torch.Tensor):
            @staticmethod
            def __new__(cls, shape):
                return torch.Tensor._make_wrapper_subclass(
                    cls, shape, dtype=torch.float32,
                    device=torch.device("privateuseone", 0))
            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
                raise RuntimeError("PROBE: fallback redispatched %s" % func)
        ks = C.DispatchKeySet(DK.PrivateUse1)
        default = probe["enable_cpu_fallback_default"]
        for flag in (False, True):
            em.enable_cpu_fallback = flag
            # The fallback logs through absl (C++ stderr), not Python warnings,
            # so capture file descriptor 2 around the call.
            with tempfile.TemporaryFile() as f:
                sys.stderr.flush(); saved = os.dup(2); os.dup2(f.fileno(), 2)
                try:
                    torch.ops.aten.linalg_eig.default.redispatch(ks, W((2, 2)))
                    res = "returned"
                except Exception as e:
                    res = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
                finally:
                    os.dup2(saved, 2); os.close(saved)
                f.seek(0)
                logged = [l.strip() for l in f.read().decode(errors="replace").splitlines()
                          if "not implemented for TPU" in l]
            probe["enable_cpu_fallback=%s" % flag] = {"result": res, "stderr": logged}
        em.enable_cpu_fallback = default
except Exception as e:  # the probe is informative only
    probe["error"] = "%s: %s" % (type(e).__name__, e)
fallback["probe"] = probe

try:
    libtpu_version = md.version("libtpu")
except md.PackageNotFoundError:
    libtpu_version = None

json.dump({
    "torch": torch.__version__,
    "torch_tpu": md.version("torch-tpu"),
    "libtpu_installed": libtpu_version,
    "tpu_library_path": stub,
    "n_all_ops": len(C._dispatch_get_all_op_names()),
    "n_privateuse1_registrations": len(pu1),
    "privateuse1_by_namespace": {ns: sum(1 for n in pu1 if n.split("::")[0] == ns)
                                 for ns in sorted({n.split("::")[0] for n in pu1})},
    "autograd_privateuse1_aten": sorted(n for n in apu1 if n.startswith("aten::")),
    "device_registration_sites": device_sites,
    "aten_added_by_torch_tpu": sorted(after_ops - torch_ops),
    # impls registered under a name that has no schema: never dispatched
    "dangling": [d.split("\n")[0].replace("name: ", "") for d in C._dispatch_find_dangling_impls()],
    "schema_only": sorted(schema_ops - torch_ops),
    "registry_only": sorted(torch_ops - schema_ops),
    "ops": ops,
    "flags": flags,
    "mismatch": mismatch,
    "n_structured": len(delegates),
    "structured_delegate_none": downgraded,
    "fallback": fallback,
}, open(out_path, "w"), indent=1)
'''


def log(msg: str) -> None:
    print(f"[regenerate] {msg}", flush=True)


def die(msg: str, code: int = 1) -> None:
    print(f"[regenerate] ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run(cmd, **kw)


def find_python311() -> str:
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    exe = shutil.which("python3.11")
    if not exe:
        die("python3.11 not found (torch-tpu 0.2.0 needs Python >= 3.11; the pinned wheels are cp311)")
    return exe


def venv_versions(py: Path) -> tuple[str | None, str | None]:
    """(torch, torch-tpu) installed in the venv, read without importing torch."""
    code = ("import importlib.metadata as m\n"
            "def v(n):\n"
            "  try: return m.version(n)\n"
            "  except m.PackageNotFoundError: return ''\n"
            "print(v('torch')); print(v('torch-tpu'))")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None
    lines = r.stdout.splitlines() + ["", ""]
    return lines[0] or None, lines[1] or None


def pinned_torch(version: str | None) -> bool:
    """True for "2.13.0" and local builds such as "2.13.0+cpu"."""
    return version is not None and version.split("+")[0] == TORCH_VERSION


def is_truthy_env(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def write_table(path: Path, provenance: dict, ops: dict[str, str]) -> None:
    """Valid JSON with exactly one op per line (reviewable diffs)."""
    prov = json.dumps(provenance, indent=2).replace("\n", "\n  ")
    lines = ["{", '  "schema": 1,', f'  "provenance": {prov},', '  "ops": {']
    keys = sorted(ops)
    for i, k in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        lines.append(f"    {json.dumps(k)}: {json.dumps(ops[k])}{comma}")
    lines += ["  }", "}", ""]
    text = "\n".join(lines)
    json.loads(text)  # must round-trip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def describe_fallback(fb: dict) -> dict | bool:
    """The provenance entry: False, or what the registered fallback is and does."""
    if not fb.get("registered"):
        return False
    probe = fb.get("probe", {})
    off = probe.get("enable_cpu_fallback=False", {})
    on = probe.get("enable_cpu_fallback=True", {})

    def generic(text: str) -> str:
        # Drop the absl "W0000 00:00:<time> <pid> " prefix and the probed op's name so that
        # regenerating gives byte-identical output.
        text = re.sub(r"^[IWEF]\d{4} [\d:.]+\s+\d+\s+", "", text)
        return text.replace("'aten::linalg_eig'", "'<op>'")

    logged = on.get("stderr", [])
    return {
        "registered": True,
        "kernel": f"boxed backend fallback registered by torch_tpu at {fb.get('site')}",
        "switch": "torch_tpu._internal.execution_mode.enable_cpu_fallback",
        "enable_cpu_fallback_default": probe.get("enable_cpu_fallback_default"),
        "default_behaviour": f"raises {generic(off['result'])}" if off else "not probed",
        "with_enable_cpu_fallback": (
            "logs to stderr through absl, not as a Python warning: "
            f"'{generic(logged[0]) if logged else '(nothing captured)'}'; "
            "then runs the op on CPU (at::native::cpu_fallback)") if on else "not probed",
        "probed_with": "aten::linalg_eig" if off else None,
        "also_registered_for": [k for k in ("AutogradPrivateUse1", "AutocastPrivateUse1",
                                            "SparsePrivateUse1") if fb.get(k)],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=None,
                    help="venv directory to create or reuse (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the venv afterwards (a reused venv is always kept)")
    ap.add_argument("--literal-precedence", action="store_true",
                    help="do not mark a structured op 'none' when its .out delegate is 'none' "
                         "(keeps 'composite-explicit' for those; see README)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help=f"where to write the table (default: {DEFAULT_OUT.relative_to(REPO)})")
    args = ap.parse_args()

    if is_truthy_env("CI") or "PYTEST_CURRENT_TEST" in os.environ:
        die("refusing to run under CI or pytest: it builds a ~2 GB venv from PyPI", 2)

    t0 = time.monotonic()
    timings: dict[str, float] = {}

    # ---- 1. venv ---------------------------------------------------------
    py311 = find_python311()
    venv = args.venv.resolve() if args.venv else Path(tempfile.mkdtemp(prefix="optable-venv-"))
    if venv == (REPO / ".venv").resolve() or venv == Path(sys.prefix).resolve():
        die(f"refusing to install torch-tpu into {venv}: it would break that environment", 2)
    py = venv / "bin" / "python"
    created = False
    if py.exists():
        tv, ttv = venv_versions(py)
        log(f"found venv {venv} (torch {tv}, torch-tpu {ttv})")
    else:
        if venv.exists() and any(venv.iterdir()):
            die(f"{venv} exists, is not empty and is not a venv")
        t = time.monotonic()
        run([py311, "-m", "venv", str(venv)], check=True)
        created = True
        tv = ttv = None
        timings["venv"] = time.monotonic() - t
    try:
        if not (pinned_torch(tv) and ttv == TORCH_TPU_VERSION):
            t = time.monotonic()
            r = run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                     f"torch=={TORCH_VERSION}", f"torch-tpu=={TORCH_TPU_VERSION}"],
                    capture_output=True, text=True)
            timings["pip install"] = time.monotonic() - t
            if r.returncode != 0:
                print(r.stdout[-4000:], r.stderr[-4000:], file=sys.stderr)
                die("pip install failed")
            tv, ttv = venv_versions(py)
            log(f"installed torch {tv}, torch-tpu {ttv}")
        else:
            log("venv already has the pinned versions; skipping pip")

        with tempfile.TemporaryDirectory(prefix="optable-") as tmp:
            tmp = Path(tmp)
            # ---- 2. stub libtpu ---------------------------------------------
            gcc = shutil.which("gcc") or shutil.which("cc")
            if not gcc:
                die("gcc not found")
            stub = tmp / "fake_libtpu.so"
            t = time.monotonic()
            run([gcc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(stub), str(STUB_SRC)], check=True)
            timings["gcc"] = time.monotonic() - t

            # ---- 3. child ---------------------------------------------------
            child_py = tmp / "dump_registrations.py"
            child_py.write_text(CHILD)
            result = tmp / "result.json"
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
            env.update({
                "TPU_LIBRARY_PATH": str(stub),
                "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",  # snapshot plain torch first
                "PYTHONWARNINGS": "ignore:<TorchTpu/Performance/TcMalloc/",
                "PYTHONNOUSERSITE": "1",
            })
            t = time.monotonic()
            log(f"running child in {venv} with TPU_LIBRARY_PATH={stub}")
            child_args = ["--literal-precedence"] if args.literal_precedence else []
            r = run([str(py), str(child_py), str(result), *child_args], env=env, cwd=tmp,
                    capture_output=True, text=True)
            timings["child"] = time.monotonic() - t
            if r.returncode != 0 or not result.exists():
                print(r.stdout[-4000:], r.stderr[-6000:], file=sys.stderr)
                die(f"child failed with exit code {r.returncode}")
            if f"GetPjrtApi was found for TPU at {stub}" not in r.stderr:
                log("WARNING: did not see PJRT load the stub in the child's stderr")
            data = json.loads(result.read_text())
    except BaseException:
        if created and not args.keep:
            shutil.rmtree(venv, ignore_errors=True)
        raise

    # ---- 4. table ------------------------------------------------------------
    if not pinned_torch(data["torch"]) or data["torch_tpu"] != TORCH_TPU_VERSION:
        die(f"child ran torch {data['torch']} / torch-tpu {data['torch_tpu']}, expected pins")
    ops: dict[str, str] = data["ops"]
    counts = {c: sum(1 for v in ops.values() if v == c) for c in CATEGORIES}
    counts["total"] = len(ops)
    provenance = {
        "torch_tpu": data["torch_tpu"],
        "torch": TORCH_VERSION,
        "generated": datetime.date.today().isoformat(),
        "generator": GENERATOR,
        "method": (
            "Imported torch_tpu on a machine without a TPU (TPU_LIBRARY_PATH pointed at a stub "
            "exporting an empty PJRT table, tools/op_coverage/fake_libtpu.c) and, for every aten "
            "operator in torch's registry, asked the dispatcher whether it has a PrivateUse1 "
            "kernel (device), else a CompositeExplicitAutograd[NonFunctional] kernel "
            "(composite-explicit), else a CompositeImplicitAutograd kernel (composite-implicit), "
            "else nothing (none)"
            + ("." if args.literal_precedence else
               "; a structured op whose structured_delegate (its .out overload, per torch's "
               "native_functions.yaml) is 'none' is 'none' too, since its composite kernel only "
               "calls that delegate.")
        ),
        "privateuse1_fallback": describe_fallback(data["fallback"]),
        "counts": counts,
    }
    write_table(args.out, provenance, ops)

    # ---- report ----------------------------------------------------------------
    if created and not args.keep:
        t = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        timings["cleanup"] = time.monotonic() - t
        log(f"removed {venv} (pass --keep to keep it)")
    else:
        log(f"kept venv {venv}")
    log(f"torch {data['torch']}, torch-tpu {data['torch_tpu']}, libtpu wheel {data['libtpu_installed']} "
        f"(not used: TPU_LIBRARY_PATH={data['tpu_library_path']})")
    log(f"dispatcher: {data['n_all_ops']} operators in all; {data['n_privateuse1_registrations']} "
        f"PrivateUse1 registrations by namespace {data['privateuse1_by_namespace']}")
    log(f"aten PrivateUse1 registration sites: {data['device_registration_sites']}")
    log(f"aten ops with a TorchTPU AutogradPrivateUse1 kernel ({len(data['autograd_privateuse1_aten'])}): "
        + ", ".join(data["autograd_privateuse1_aten"]))
    if data["aten_added_by_torch_tpu"]:
        log(f"aten names that appear only after importing torch_tpu (not in the table): "
            f"{data['aten_added_by_torch_tpu']}")
    if data["dangling"]:
        log(f"dangling impls (kernels registered for a name with no schema; never dispatched): "
            f"{data['dangling']}")
    log(f"{len(data['schema_only'])} aten schemas are TorchScript-only, not dispatcher operators, "
        f"and are not in the table (e.g. {', '.join(data['schema_only'][:3])})")
    if data["registry_only"]:
        log(f"WARNING: dispatcher ops missing from the JIT schema list: {data['registry_only'][:10]}")
    sd = data["structured_delegate_none"]
    log(f"{len(sd)} of {data['n_structured']} structured ops have a composite-explicit wrapper whose "
        f".out delegate is 'none'; "
        + ("kept as composite-explicit (--literal-precedence)" if args.literal_precedence
           else "marked 'none'")
        + ": " + ", ".join(k.replace("aten::", "") for k, _ in sd))
    if data["mismatch"]:
        log(f"WARNING: {len(data['mismatch'])} ops where the computed PrivateUse1 slot disagrees "
            f"with the category, e.g. {data['mismatch'][:5]}")
    else:
        log("self-check: every op's computed PrivateUse1 slot matches its category "
            "(before the structured-delegate step)")
    log("PrivateUse1 fallback: " + json.dumps(provenance["privateuse1_fallback"]))
    log(f"counts: {json.dumps(counts)}")
    try:
        shown = args.out.resolve().relative_to(REPO)
    except ValueError:
        shown = args.out
    log(f"wrote {shown}")
    timings["total"] = time.monotonic() - t0
    log("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
