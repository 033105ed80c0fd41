"""`jobgen image-context`'s commands: which of jobgen's images a site's recipes need on its
container backends (env/containers/images.yaml), and the docker commands that build them with
the declaration's build arguments, tag them for the site's repositories and push them."""
from __future__ import annotations

import re
from typing import Callable, Optional

from ..plumbing.errors import JobgenError, printable
from ..plumbing.render import shell_path, shell_quote
from . import catalog as images

# Registries that need a `docker login` through the AWS CLI before a pull or a push.
ECR_HOST_RE = re.compile(r"[0-9]{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?")
LOCAL_REPOSITORY = "jobgen"   # the tag's repository where the site names none


def _needed(site_ref: Optional[str], say: Callable[[str], None]
            ) -> tuple[dict[str, tuple[images.Image, list[str], list[str]]], Optional[str]]:
    """image name -> (image, repositories to tag it for, recipes that need it); the region
    the site's AWS sections name (SMP's base image is in each region's registry)."""
    from .. import backends
    from ..inputs import recipe
    from ..inputs import site as sites
    site = sites.load(site_ref)
    region = next((s.region for s in (site.sagemaker, site.batch)
                   if s is not None and s.region), None)
    out: dict[str, tuple[images.Image, list[str], list[str]]] = {}
    for backend in backends.having(lambda d: d.container):
        section = getattr(site, backends.declaration(backend).site_section)
        if section is None:
            continue
        repository = section.repository or LOCAL_REPOSITORY
        for name in recipe.recipe_names():
            try:
                # The recipe as this backend trains it (its overlay): the image depends on the
                # platform and the payload only, not on a node count.
                rec, source = recipe.load(name, backend=backend)
                image = images.for_recipe(rec.platform, rec.payload, source)
            except JobgenError as exc:
                say(printable(f"note: {name} on {backend}: no image needed ({exc})"))
                continue
            _, repos, recipes = out.setdefault(image.name, (image, [], []))
            if repository not in repos:
                repos.append(repository)
            if name not in recipes:
                recipes.append(name)
    if not out:
        say(f"note: site {site.name} has no container backend section (batch, sagemaker, eks) "
            "that runs its recipes")
    return out, region


def _login(registry: str) -> Optional[str]:
    found = ECR_HOST_RE.fullmatch(registry)
    if found is None:
        return None
    return (f"aws ecr get-login-password --region {shell_quote(found.group(1))} | docker login "
            f"--username AWS --password-stdin {shell_quote(registry)}")


def build_commands(site_ref: Optional[str], context: str, full_digest: str,
                   say: Callable[[str], None]) -> list[str]:
    """The lines `jobgen image-context` prints: per image a comment, the logins its base image
    and its repositories need, `docker build` and `docker push`."""
    needed, region = _needed(site_ref, say)
    lines: list[str] = []
    logged_in: set[str] = set()
    q = shell_quote   # the one choke point: no raw control character, every word quoted

    def login(registry: str) -> None:
        command = _login(registry)
        if command is not None and registry not in logged_in:
            logged_in.add(registry)
            lines.append(command)

    for image, repos, recipes in needed.values():
        tag = images.tag(image, full_digest)
        lines.append(printable(f"# {image.name}: {image.trainer} on "
                               f"{', '.join(image.platforms)} (torch {image.torch}, Python "
                               f"{image.python}, {image.sdk}), for {', '.join(recipes)}"))
        args = images.build_args(image, region)
        login(args[0][1].split("/")[0])
        build = [f"docker build -f {shell_path(context + '/env/containers/' + image.dockerfile)}"]
        build += [f"--build-arg {q(f'{k}={v}')}" for k, v in args]
        build += [f"--label {q(f'io.jobgen.payload={full_digest}')}",
                  f"--label {q(f'io.jobgen.image={image.name}')}"]
        build += [f"-t {q(f'{repo}:{tag}')}" for repo in repos]
        lines.append(" ".join(build + [shell_path(context)]))
        for repo in repos:
            if "/" in repo:   # a registry to push to (a bare name stays on this machine)
                login(repo.split("/")[0])
                lines.append(f"docker push {q(f'{repo}:{tag}')}")
    return lines
