"""Exported modules: an optimized model written to one directory, and loaded back in seconds.

``export`` writes what it takes to run the module without optimizing it again::

    manifest.json     what the rest is: model hash, target, threads, the device it was
                      optimized for (this machine, or a fleet's device), library versions,
                      inputs, kernels, the placement
    tvm.so            the assembled module compiled by TVM (``Executable.export_library``):
                      every TVM partition and the calls of the other kernels
    kernels/K.json    a sub-graph a library outside TVM runs (the Relax function, as TVM's
                      JSON), compiled again by that library when loading
    kernels/K.onnx    an ONNX model an engine runs with its users' settings, whole or all
                      but trivial ops: the user's own file, or collage's conversion (read
                      back faster than TVM's JSON of a whole model's weights)
    kernels/K.pt2     the user's PyTorch program (``torch.export.save``) an engine compiles
                      whole (inductor), in place of ``main``
    kernels/K.module.pt  the user's module it was exported from (``torch.save``), which that
                      engine compiles instead where it loads (its class importable here);
                      the kernel's only file where ``torch.export`` could not export it
    main.json         where ``main`` is one engine's kernel: that ``main`` (TVM's JSON), so
                      the loaded module calls the kernel without the VM, as ``opt(x)`` does

``load`` reads the manifest, compiles each library's kernel again from its file (sessions
of ONNX Runtime or OpenVINO, torch functions: no TVM code is compiled and nothing is
measured), loads ``tvm.so`` and binds the kernels to the calls in it. A different TVM is an
``ExportError`` (the compiled library and the JSON are TVM's own formats); another device,
another version of a kernel's library or of collage is a warning that says what differs,
since the module still runs right, only its placement may no longer be the fastest.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..assembling.assemble import sole_kernel
from ..assembling.caller import Caller, CallPath
from ..candidates.backend import Backend, BackendSet, default_backends, installed_version
from ..candidates.onnx_convert import to_onnx
from ..candidates.precision import FLOAT32
from ..errors import first_line
from ..measuring.cost import Device
from ..measuring.build import (compile_kernel, compile_module, compile_onnx_kernel, compile_program_kernel, device_for,
                              is_cuda)
from ..measuring.arrays import random_array, static_shape, to_tensors
from ..measuring.threads import pin_threads
from ..model import as_given
from .saved import placement_record

FORMAT = "collage-export"
VERSION = 1
MANIFEST = "manifest.json"
TVM_LIBRARY = "tvm.so"
MAIN = "main.json"
KERNELS = "kernels"
# The distributions whose versions decide whether an export still loads and runs as it did.
TVM_DISTRIBUTIONS = ("apache-tvm", "apache-tvm-ffi")  # a difference is an error
OTHER_DISTRIBUTIONS = ("collage-tvm",)  # a difference is a warning


class ExportError(Exception):
    """The export cannot be written or loaded here; the message says why."""


class ExportWarning(UserWarning):
    """The export loads, but was made on another device or with other library versions."""


def export(opt, path: str | os.PathLike) -> Path:
    """Write the optimized module ``opt`` (an ``OptimizedModule``) to the directory ``path``
    (created; files of an earlier export there are replaced); returns the path."""

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ExportError(f"{path}: exists and is not a directory")
    assembly = opt.assembly
    if as_given.stand_in_of(assembly.module) is not None:
        raise ExportError(f"{path}: the optimized module runs the model as given, in this process only, since "
                          f"{opt.record.not_imported}; an engine running it whole would export")  # fmt: skip
    (path / KERNELS).mkdir(parents=True, exist_ok=True)
    kernels = []
    for k, (partition, name, _) in enumerate(assembly.kernels):
        source, module_file = assembly.sources[name], None
        onnx_model = source.onnx_model
        if onnx_model is None and source.alone and _reads_onnx(source.backend):
            onnx_model = to_onnx(source.subgraph.extract())  # what build.compile_kernel compiled it from
        if source.program is not None:
            import torch

            file = f"{KERNELS}/{k}.pt2"
            torch.export.save(source.program, path / file)
            module_file = _saved_module(source.module, path / f"{KERNELS}/{k}.module.pt")
        elif source.module is not None:  # a module torch.export cannot export: the module alone
            file = _saved_module(source.module, path / f"{KERNELS}/{k}.module.pt")
            if file is None:
                raise ExportError(f"{path}: {source.backend} compiles the PyTorch module whole, which neither "
                                  "pickles nor exports (torch.export): an export cannot hold it")  # fmt: skip
        elif onnx_model is not None:
            file = f"{KERNELS}/{k}.onnx"
            (path / file).write_bytes(onnx_model.SerializeToString())
        else:
            file = f"{KERNELS}/{k}.json"
            (path / file).write_text(tvm.ir.save_json(source.subgraph.extract()))
        kernels.append({
            "name": name, "backend": source.backend, "pattern": source.pattern, "alone": source.alone,
            "beside_spinning": source.beside_spinning, "precision": source.precision,
            "file": file, "library": _library(source.backend),
        } | ({"module": module_file} if module_file else {}))  # fmt: skip
    # Compiled as optimize compiled it: on CUDA, with CUDA graphs where its kernels allow them
    # (a kernel of a backend not registered here counts as not graph-safe).
    registered = default_backends()
    kernels_by_backend = {name: registered[p.backend] for p, name, _ in assembly.kernels if p.backend in registered.names()}
    compile_module(assembly.module, _export_target(opt), kernels_by_backend).export_library(str(path / TVM_LIBRARY))
    main = assembly.module["main"]
    (path / MAIN).unlink(missing_ok=True)
    if sole_kernel(main, assembly.kernel_map()) is not None:  # small: no weights in it
        (path / MAIN).write_text(tvm.ir.save_json(main))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "target": opt.target,
        "threads": opt.optimized_for.threads,
        "device": opt.optimized_for.name,  # measured and timed there: this machine, or a fleet's device
        "libraries": {d: installed_version(d) for d in (*TVM_DISTRIBUTIONS, *OTHER_DISTRIBUTIONS)},
        "inputs": [
            {"name": p.name, "shape": list(static_shape(p.ty)), "dtype": str(p.ty.dtype)} for p in main.params
        ],
        "kernels": kernels,
        "measured_ms": opt.measured.median_ms,
        "call_path": opt.caller.path.name,  # how opt(x) reached the module fastest where it was optimized
        "placement": placement_record(opt).to_json(),
    }
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def _reads_onnx(backend: str) -> bool:
    backends = default_backends()
    return backend in backends.names() and backends[backend].compile_onnx is not None


def _library(backend: str) -> str:
    """The library (and its version) a backend drives, as the registered backend says."""
    return default_backends()[backend].library if backend in default_backends().names() else ""


@dataclass
class ExportedModule:
    """An exported module loaded back: call it with numpy arrays like the original ``main``
    (or ``main`` with ``tvm.runtime.Tensor``s). ``load_s`` is how long loading took; ``vm``
    runs it, calling ``kernels``."""

    manifest: dict
    load_s: float
    vm: relax.VirtualMachine = field(repr=False)
    kernels: dict = field(default_factory=dict, repr=False)  # the libraries' kernels the VM calls, by name
    main_function: relax.Function | None = field(default=None, repr=False)  # ``main`` when it is one kernel

    def __call__(self, *arrays):
        return self.caller.numpy(*arrays)

    @property
    def main(self):
        """``main`` on ``tvm.runtime.Tensor`` inputs, copied into the module's own buffers
        (``collage.assembling.caller``)."""
        return self.caller.tensors

    @functools.cached_property
    def caller(self) -> Caller:
        signature = [(i["name"], tuple(i["shape"]), i["dtype"]) for i in self.manifest["inputs"]]
        path = CallPath[self.manifest.get("call_path", CallPath.ENGINE.name)]
        return Caller(self.vm, signature, device_for(self.target), self.main_function, self.kernels, path)

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs of the right shapes and types, drawn as ``arrays.random_inputs`` draws them
        (the manifest does not say which operators each feeds: floats are normal)."""
        rng = np.random.default_rng(seed)
        return [random_array(rng, tuple(i["shape"]), i["dtype"]) for i in self.manifest["inputs"]]

    def first_call_s(self, arrays) -> float:
        """Seconds the first call on ``arrays`` takes (the libraries' lazy set-up included);
        call it before any other."""
        tensors = to_tensors(arrays, device_for(self.target))
        started = time.perf_counter()
        self.main(*tensors)
        return time.perf_counter() - started

    @property
    def target(self) -> str:
        return self.manifest["target"]

    def describe(self) -> str:
        """A few lines: where it was optimized, what runs it, how long it took then."""
        parts = self.manifest["placement"]["partitions"]
        backends = ", ".join(sorted({p["backend"] for p in parts}))
        placed = f"{len(parts)} partition(s) on {backends}" if parts else "nothing placed, the whole model on TVM"
        return "\n".join([
            f"exported module: {placed}; {len(self.manifest['kernels'])} library kernel(s), the rest compiled TVM code",
            f"optimized for {self.manifest['device']}, {self.manifest['threads']} thread(s), target {self.target}; "
            f"it ran in {self.manifest['measured_ms']:.3f} ms there",
            f"loaded in {self.load_s:.2f} s (nothing measured, no TVM code compiled)",
        ])  # fmt: skip


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the export at ``path``; ``ExportError`` if it is not one."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise ExportError(f"{path}: not a collage export (no {MANIFEST})")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(f"{path / MANIFEST}: unreadable ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ExportError(f'{path}: not a collage export (no "format": "{FORMAT}")')
    if manifest.get("version") != VERSION:
        raise ExportError(f"{path}: export format version {manifest.get('version')}; this collage reads {VERSION}")
    return manifest


def load(
    path: str | os.PathLike, backends: BackendSet | Iterable[Backend] | None = None, threads: int | None = None
) -> ExportedModule:
    """The module exported to ``path``, ready to call: each library kernel compiled again
    from its file by the backend of that name (from ``backends``, default the registered
    ones), TVM's part loaded as compiled. Runs on ``threads`` threads (default: the exported
    module's). Raises ``ExportError`` when it cannot run here."""
    started = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    _check_tvm(manifest, path)
    backend_set = backends if isinstance(backends, BackendSet) else BackendSet(backends) if backends else default_backends()
    target = manifest["target"]
    threads = threads or manifest["threads"]
    pin_threads(threads)
    _warn_if_elsewhere(manifest, backend_set, path, threads)
    kernels = {entry["name"]: _kernel(entry, backend_set, target, threads, path) for entry in manifest["kernels"]}
    if not (path / TVM_LIBRARY).is_file():
        raise ExportError(f"{path}: the export lacks {TVM_LIBRARY}")
    library = tvm.runtime.load_module(str(path / TVM_LIBRARY))
    # The VM looks up each called kernel by name once, when it is made: register them for that
    # moment only, so that two loaded modules never see each other's kernels.
    for name, kernel in kernels.items():
        tvm.register_global_func(name, kernel, override=True)
    try:
        vm = relax.VirtualMachine(library, device_for(target))
    finally:
        for name in kernels:
            tvm_ffi.remove_global_func(name)
    main = tvm.ir.load_json((path / MAIN).read_text()) if (path / MAIN).is_file() else None
    return ExportedModule(manifest, time.perf_counter() - started, vm, kernels, main)


def _check_tvm(manifest: dict, path: Path) -> None:
    saved = manifest.get("libraries", {})
    differ = [f"{d} {saved.get(d)} (here {installed_version(d)})" for d in TVM_DISTRIBUTIONS if saved.get(d) != installed_version(d)]
    if differ:
        raise ExportError(f"{path}: exported with {', '.join(differ)}; TVM's compiled code loads only in the TVM that made it: export it again here")


def _saved_module(module, file: Path) -> str | None:
    """``module`` pickled whole into ``file`` (its class by name, its weights), and that file's
    name relative to the export; None where it does not pickle (a class defined inside a
    function, a lambda in it): the program is compiled in its place when loading."""
    import torch

    if module is None:
        return None
    try:
        torch.save(module, file)
    except Exception as err:  # noqa: BLE001 -- pickling fails in as many ways as objects do
        file.unlink(missing_ok=True)
        warnings.warn(f"{file.parent.parent}: the PyTorch module does not pickle ({type(err).__name__}: "
                      f"{first_line(err)}); a load compiles its exported program instead", ExportWarning, stacklevel=4)
        return None
    return f"{KERNELS}/{file.name}"


def _loaded_module(file: Path):
    """The user's module from ``file`` (``_saved_module``), or None where it does not load here
    (its class no longer importable), with a warning: its exported program is compiled instead.
    Unpickling runs the code the export names, as loading its ``tvm.so`` does: load exports
    you made."""
    import torch

    try:
        return torch.load(file, weights_only=False)
    except Exception as err:  # noqa: BLE001 -- unpickling fails in as many ways as objects do
        warnings.warn(f"{file}: the PyTorch module does not load here ({type(err).__name__}: {first_line(err)}); "
                      "its exported program is compiled instead", ExportWarning, stacklevel=4)  # fmt: skip
        return None


def _export_target(opt):
    """What an export's TVM part is compiled for: as ``optimize`` compiled it, for this
    machine's own CPU (``build.host_target``), where it was optimized for this machine; for
    the CPU's baseline, which every CPU of its architecture runs, where it was optimized for a
    fleet's device, whose CPU this machine's code may not run on (AVX-512 on a Zen 3)."""
    if opt.device is None or is_cuda(opt.target):
        return opt.target
    return {"kind": "llvm", "mcpu": "generic"}


def _warn_if_elsewhere(manifest: dict, backends: BackendSet, path: Path, threads: int) -> None:
    """A warning for each way this machine, running ``threads`` threads, differs from the
    device the module was optimized for."""
    here = Device.this_machine(threads, manifest["target"])
    made_for = Device(manifest.get("device") or "?", manifest["threads"])
    if made_for != here:
        warnings.warn(
            f"{path}: optimized for {made_for}, loaded on {here}: it runs, but its placement was "
            "measured there; optimize again here for the fastest", ExportWarning, stacklevel=3,
        )  # fmt: skip
    for d in OTHER_DISTRIBUTIONS:
        if manifest["libraries"].get(d) != installed_version(d):
            warnings.warn(f"{path}: exported by {d} {manifest['libraries'].get(d)}, loaded by {installed_version(d)}",
                          ExportWarning, stacklevel=3)  # fmt: skip
    for entry in manifest["kernels"]:
        if entry["backend"] in backends.names() and entry["library"] != backends[entry["backend"]].library:
            warnings.warn(
                f"{path}: kernel {entry['name']} was measured on {entry['library']}; here {entry['backend']} "
                f"is {backends[entry['backend']].library}", ExportWarning, stacklevel=3,
            )  # fmt: skip


def _kernel(entry: dict, backends: BackendSet, target: str, threads: int, path: Path):
    """One library's kernel, compiled again from its file as ``optimize`` compiled it."""
    if entry["backend"] not in backends.names():
        raise ExportError(f"{path}: kernel {entry['name']} runs on backend {entry['backend']!r}, which is not registered here")
    backend = backends[entry["backend"]]
    file = path / entry["file"]
    if not file.is_file():
        raise ExportError(f"{path}: the export lacks {entry['file']}")
    if file.suffix == ".onnx":
        import onnx

        kernel, reason = compile_onnx_kernel(backend, onnx.load(file), target, threads, entry["alone"],
                                             entry.get("precision", FLOAT32), entry.get("beside_spinning", False))
    elif file.suffix in (".pt2", ".pt"):  # the user's PyTorch program, or module, compiled whole in place of main
        import torch

        if not (path / MAIN).is_file():
            raise ExportError(f"{path}: the export lacks {MAIN}, the main its kernel {entry['name']} replaces")
        main = tvm.ir.load_json((path / MAIN).read_text())
        module = _loaded_module(path / entry["module"]) if "module" in entry else None
        program = torch.export.load(file) if file.suffix == ".pt2" else None
        if program is None and (module := _loaded_module(file)) is None:
            raise ExportError(f"{path}: the PyTorch module of kernel {entry['name']} does not load here, and the "
                              "export holds no program of it")  # fmt: skip
        kernel, reason = compile_program_kernel(backend, program, main, target, threads,
                                                entry.get("precision", FLOAT32), module)  # fmt: skip
    else:
        func = tvm.ir.load_json(file.read_text())
        kernel, reason = compile_kernel(backend, func, entry["pattern"], target, threads, entry["alone"],
                                        entry.get("precision", FLOAT32), entry.get("beside_spinning", False))
    if reason is None:
        return kernel
    raise ExportError(f"{path}: {backend.name} cannot compile kernel {entry['name']} here: {reason}")
