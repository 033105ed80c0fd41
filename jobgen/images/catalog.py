"""What jobgen's container images hold (env/containers/images.yaml), asked by the image build
(`jobgen image-context`), the renderer (which image a job names, where the trainer and the
payload are inside it), the container rehearsals (the file tree they lay out) and the checks.

An image is keyed by platform and trainer; the declaration's `trainers` says which
payloads each trainer runs. A site names only the repository images are pushed to; the tag
is the image's name and the payload id."""
from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ..plumbing.errors import ConfigError
from ..plumbing.record import record

if TYPE_CHECKING:
    from ..inputs.platforms import Platform
    from ..inputs.recipe import Recipe
    from ..inputs.site import Site


class ImageSpec(Protocol):
    """What this module reads of a job spec (jobgen/job/spec.py's JobSpec, which imports this
    module: named by its shape, so that no import circle runs through the type)."""
    @property
    def site(self) -> Site: ...

    @property
    def platform(self) -> Platform: ...

    @property
    def recipe(self) -> Recipe: ...

    @property
    def source(self) -> str: ...

    @property
    def payload_digest(self) -> str: ...

FILE = "env/containers/images.yaml"
# A path inside an image: absolute, no spaces or colons (the node's flow splits lists on ':').
PATH_RE = re.compile(r"/[A-Za-z0-9._/-]+")
# A pip requirement the build installs: one word (PACKAGES is split on spaces), nothing a shell
# or a Dockerfile would read otherwise.
PACKAGE_RE = re.compile(r"[A-Za-z0-9][^\s'\"`$\\;&|]*")
VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+)+")


@record
class Checkout:
    arg: str      # the Dockerfile's build argument that names where it is cloned
    path: str     # where it is inside the image


@record
class Image:
    name: str                  # its key, and its tag's first part (trn1-nemo)
    platforms: tuple[str, ...]
    trainer: str
    dockerfile: str            # under env/containers/
    base: str                  # BASE_IMAGE; {region}: the site's region
    torch: str
    python: str                # the base's Python (major.minor)
    sdk: str
    packages: tuple[str, ...]  # pip requirements the image adds to its base
    imports: tuple[str, ...]   # Python statements its build runs (the payload and trainer)
    build_args: dict[str, str] = dataclasses.field(default_factory=dict)
    checkout: Optional[Checkout] = None
    paths: dict[str, str] = dataclasses.field(default_factory=dict)   # site path key -> rel.
    files: tuple[str, ...] = ()                                       # relative to checkout
    starts: tuple[str, ...] = ()   # the payload's wrapper and the program (one of `files`)

    def path_of(self, key: str) -> str:
        assert self.checkout is not None
        return posixpath.join(self.checkout.path, self.paths[key])

    def trainer_files(self) -> tuple[str, ...]:
        """The trainer's files a node checks before it starts, absolute inside the image."""
        if self.checkout is None:
            return ()
        return tuple(posixpath.join(self.checkout.path, f) for f in self.files)


@record
class Declaration:
    jobgen_dir: str
    entrypoints: dict[str, str]
    workdir: str
    trainers: dict[str, tuple[str, ...]]
    images: dict[str, Image]

    @property
    def payload_dir(self) -> str:
        return posixpath.join(self.jobgen_dir, "payload")

    def entrypoint(self, backend: str) -> str:
        return posixpath.join(self.jobgen_dir, self.entrypoints[backend])


@lru_cache(maxsize=None)
def declared() -> Declaration:
    """The declaration, read and checked once per process."""
    from ..inputs import schema
    from ..inputs.yamlfile import load_yaml
    from ..plumbing import resources
    raw = load_yaml(resources.folder("containers") / "images.yaml", FILE)
    images = raw.get("images")
    if isinstance(images, dict):
        raw = {**raw, "images": {k: {"name": k, **v} if isinstance(v, dict) else v
                                 for k, v in images.items()}}
    out = schema.build(Declaration, raw, FILE)
    paths = [("jobgen_dir", out.jobgen_dir), ("workdir", out.workdir)]
    for image in out.images.values():
        if image.checkout is not None:
            paths.append((f"images.{image.name}.checkout.path", image.checkout.path))
            paths += [(f"images.{image.name}.paths.{k}", image.path_of(k)) for k in image.paths]
            paths += [(f"images.{image.name}.files", f) for f in image.trainer_files()]
        elif image.paths or image.files or image.starts:
            raise ConfigError(f"{FILE}: images.{image.name}: paths, files and starts need a "
                              "checkout")
        if image.starts and (len(image.starts) != 2 or image.starts[1] not in image.files
                             or not image.starts[0].endswith(".py")):
            raise ConfigError(f"{FILE}: images.{image.name}.starts: the payload's wrapper "
                              "(a .py file under the payload) and one of `files`")
        _check_additions(image)
    for key, value in paths:
        if not PATH_RE.fullmatch(value):
            raise ConfigError(f"{FILE}: {key}: {value!r} must be an absolute path of letters, "
                              "digits and ._-/")
    return out


def _check_additions(image: Image) -> None:
    where = f"{FILE}: images.{image.name}"
    for key in ("torch", "python"):
        if not VERSION_RE.fullmatch(getattr(image, key)):
            raise ConfigError(f"{where}.{key}: {getattr(image, key)!r} is not a version")
    for package in image.packages:
        if not PACKAGE_RE.fullmatch(package):
            raise ConfigError(f"{where}.packages: {package!r} must be one pip requirement "
                              "without spaces or quotes")
    if not image.imports or any("\n" in s or not s.strip() for s in image.imports):
        raise ConfigError(f"{where}.imports: one or more one-line Python statements")


def import_path(image: Image) -> str:
    """What the build puts on PYTHONPATH to run `imports`: the trainer's payload folders, the
    payload root, and the folders of the trainer's Python files in its checkout."""
    decl = declared()
    folders = [posixpath.join(decl.payload_dir, p) for p in decl.trainers[image.trainer]]
    folders.append(decl.payload_dir)
    started = start_check(image)[2:3]      # the started program's folder: as the job has it
    for path in image.trainer_files():
        if path.endswith(".py") and posixpath.dirname(path) not in folders \
                and path not in started:
            folders.append(posixpath.dirname(path))
    return ":".join(folders)


def start_check(image: Image) -> list[str]:
    """The arguments the build gives the image's python3 to start its program as a job does
    (the wrapper's --check: the program's imports run, its main does not); [] without one."""
    if not image.starts or image.checkout is None:
        return []
    wrapper, program = image.starts
    return [posixpath.join(declared().payload_dir, wrapper), "--check",
            posixpath.join(image.checkout.path, program)]


def find(platform: str, trainer: str) -> Optional[Image]:
    for image in declared().images.values():
        if platform in image.platforms and image.trainer == trainer:
            return image
    return None


def trainer_of(payload: str) -> Optional[str]:
    return next((t for t, runs in declared().trainers.items() if payload in runs), None)


def for_recipe(platform: str, payload: str, where: str) -> Image:
    """The image that runs `payload` on `platform` (`where`: the recipe, for the message)."""
    trainer = trainer_of(payload)
    image = find(platform, trainer) if trainer else None
    if image is None:
        raise ConfigError(f"{where}: payload {payload} on {platform}: no jobgen image holds "
                          f"its trainer ({trainer or 'none named'}) for that platform "
                          f"({FILE})")
    return image


def for_spec(spec: ImageSpec) -> Image:
    return for_recipe(spec.platform.name, spec.recipe.payload, spec.source)


def with_image_paths(site: "Site", platform: str, payload: str) -> "Site":
    """The site as a container of jobgen's image sees it: the trainer where the image holds
    it (a site's own checkout paths are for hosts, Slurm's nodes)."""
    trainer = trainer_of(payload)
    image = find(platform, trainer) if trainer else None
    if image is None or not image.paths:
        return site
    moved: dict[str, Any] = {key: image.path_of(key) for key in image.paths}
    return dataclasses.replace(site, paths=dataclasses.replace(site.paths, **moved))


def tag(image: Image, full_digest: str) -> str:
    from .snapshot import short
    return f"{image.name}-{short(full_digest)}"


def prepare(spec: ImageSpec, section: str) -> None:
    """Before a container backend's job is submitted: the site says where its image is."""
    uri(spec, section)


def uri(spec: ImageSpec, section: str) -> str:
    """The image a container backend's job names: the site's `section.repository`, tagged
    with the image and the payload id."""
    site = getattr(spec.site, section)
    repository = getattr(site, "repository", None) if site is not None else None
    if not repository:
        raise ConfigError(f"site {spec.site.name}: {section}.repository is required (where "
                          "jobgen's images are pushed: REGISTRY/REPOSITORY; `jobgen "
                          "image-context` prints the builds)")
    return f"{repository}:{tag(for_spec(spec), spec.payload_digest)}"


def base_image(image: Image, region: Optional[str]) -> str:
    return image.base.replace("{region}", region or "us-west-2")


def build_args(image: Image, region: Optional[str]) -> list[tuple[str, str]]:
    """The image's build arguments, in order: its base (and the torch and Python it must
    carry), its own, where things go inside, what it adds and what its build imports."""
    decl = declared()
    out = [("BASE_IMAGE", base_image(image, region)), ("BASE_TORCH", image.torch),
           ("BASE_PYTHON", image.python), *image.build_args.items()]
    if image.checkout is not None:
        out.append((image.checkout.arg, image.checkout.path))
    out.append(("JOBGEN_DIR", decl.jobgen_dir))
    out += [("PACKAGES", " ".join(image.packages)), ("IMPORTS", json.dumps(list(image.imports))),
            ("IMPORT_PATH", import_path(image))]
    if image.starts:
        out.append(("START_CHECK", json.dumps(start_check(image))))
    return out


def layout(spec: ImageSpec) -> dict[str, Any]:
    """What the image of `spec` holds where, for rehearsals and messages."""
    decl, image = declared(), for_spec(spec)
    return {"image": image.name, "payload_dir": decl.payload_dir,
            "entrypoints": {b: decl.entrypoint(b) for b in decl.entrypoints},
            "checkout": image.checkout.path if image.checkout else None,
            "trainer_files": list(image.trainer_files())}
