"""The projects whose kernels replace a model's ops: the user's, in the order given, then the
kit's library (the folders of `kernels/*/kitdispatch.toml`), combined into one module.

For an op that several kernels compute, the first project's kernel wins (replace.decide takes
kernels in order), then the library's. Each kernel keeps its own folder: its source, include
folders and pattern are made absolute against its manifest's folder, and its module's include
folders and defines become its own, so that kernels of several manifests build as one module.
Names that must be unique in that module are told apart (a later project's kernel function that
an earlier project defines too is prefixed with its module's name) or, where that cannot tell
them apart, refused naming both projects.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._resources import data_dir
from kitdispatch.describe.kernel import Kernel
from kitdispatch.describe.manifest import MANIFEST_NAME, load_manifest
from kitdispatch.describe.module import ModuleSpec
from kitdispatch.errors import ManifestError, UsageError
from kitdispatch.models.replace import replacing_kernels

Project = ModuleSpec | str | Path


@dataclass(frozen=True)
class ModelProjects:
    """The projects of one model build, in order of precedence, and the module they make."""

    projects: tuple[ModuleSpec, ...]
    module: ModuleSpec
    library: bool  # whether the kit's library is among them

    @property
    def names(self) -> str:
        """The projects as a record and a report name them: `mine+softmax+matmul`."""
        return "+".join(p.name for p in self.projects)


def model_projects(project: Project | Sequence[Project] | None, *, library: bool = True) -> ModelProjects:
    """The user's projects (a path, a ModuleSpec, a sequence of them, or None), then the
    library's unless `library` is False, combined into one module."""
    given = _given(project)
    mine = [p if isinstance(p, ModuleSpec) else load_manifest(p) for p in given]
    for spec in mine:
        replacing_kernels(spec)  # a project named for a model must declare `replaces`, as before
    chosen = list(mine)
    if library:
        roots = {_root(s) for s in mine}
        chosen += [s for s in library_projects() if _root(s) not in roots]
    if not chosen:
        raise UsageError(
            "no kernels to replace the model's ops with: no project was given and the library is off",
            fix="pass a project (kitdispatch.toml or its folder), or leave out --no-library (library=False)",
        )
    return ModelProjects(tuple(chosen), combine(chosen), library)


def _given(project: Project | Sequence[Project] | None) -> tuple[Project, ...]:
    if project is None:
        return ()
    if isinstance(project, (ModuleSpec, str, Path)):
        return (project,)
    return tuple(project)


def _root(spec: ModuleSpec) -> Path:
    try:
        return spec.root.resolve()
    except (OSError, RuntimeError):
        return spec.root


def library_projects() -> tuple[ModuleSpec, ...]:
    """The library's folders that hold a kernel declaring `replaces`, by folder name."""
    try:
        kernels = data_dir("kernels")
    except FileNotFoundError:
        return ()
    specs = (load_manifest(m.parent) for m in sorted(kernels.glob(f"*/{MANIFEST_NAME}")))
    return tuple(s for s in specs if any(k.replaces is not None for k in s.kernels))


def combine(projects: Sequence[ModuleSpec]) -> ModuleSpec:
    """One module of every kernel of `projects` that declares `replaces`, in order. One
    project is itself (its build is as it always was)."""
    if len(projects) == 1:
        return projects[0]
    kernels: list[Kernel] = []
    owners: dict[str, ModuleSpec] = {}  # function -> the project defining it
    for spec in projects:
        for kernel in spec.kernels:
            if kernel.replaces is None:
                continue
            kernel = _told_apart(_standalone(spec, kernel), spec, owners)
            owners[kernel.function] = spec
            kernels.append(kernel)
    first = projects[0]
    return ModuleSpec(first.name, first.root, tuple(kernels))


def _standalone(spec: ModuleSpec, kernel: Kernel) -> Kernel:
    """`kernel` with every path absolute and its module's compile options as its own: the
    combined module's root is the first project's, against which a relative path of another
    project (`kitdispatch build kernels/matmul kernels/norm`) would be read twice."""

    def absolute(path: Path) -> Path:
        return Path(os.path.abspath(spec.source_path(path)))

    dirs = tuple(str(absolute(Path(d))) for d in (*spec.include_dirs, *kernel.include_dirs))
    replaces = kernel.replaces
    if replaces is not None and replaces.pattern is not None:
        replaces = dataclasses.replace(replaces, pattern=absolute(Path(replaces.pattern)))
    return dataclasses.replace(
        kernel,
        source=absolute(kernel.source),
        include_dirs=tuple(dict.fromkeys(dirs)),
        defines=tuple(dict.fromkeys((*spec.defines, *kernel.defines))),
        replaces=replaces,
    )


def _told_apart(kernel: Kernel, spec: ModuleSpec, owners: dict[str, ModuleSpec]) -> Kernel:
    """A later project's function that an earlier one defines too gets its module's name first."""
    if kernel.function not in owners:
        return kernel
    renamed = f"{spec.name}_{kernel.function}"
    if renamed not in owners:
        return dataclasses.replace(kernel, function=renamed)
    other = owners[kernel.function]
    raise ManifestError(
        f"kernel {kernel.name!r} is in both {other.name} ({other.root}) and {spec.name} ({spec.root}), "
        f"and their functions ({kernel.function!r}) cannot be told apart in one build",
        where=str(spec.root / MANIFEST_NAME),
        fix="rename one: give the kernel another `function = ...`, or the module another `name`",
    )


__all__ = ["ModelProjects", "Project", "combine", "library_projects", "model_projects"]
