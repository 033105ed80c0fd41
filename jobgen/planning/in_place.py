"""Which failures `jobgen plan` restarts inside the allocation and which it requeues.

A failure is a node lost or, with the site's `plan.process_failure_share` p, a process failing on
healthy nodes. torchrun's restarts (job.restarts_in_place: K, only where the nodes share the run
folder) keep process failures in place; spare nodes (job.spare_nodes: S) keep node losses in
place; a requeue brings both budgets back whole. The requeued share of all failures is then
1 / (E[T] E[N]), with E[T] = 1 + p + ... + p^K and E[N] = 1 + (1 - a) + ... + (1 - a)^S,
a = p^(K+1): the derivation and its limits are in docs/planning.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..inputs.site import Site
from ..job.spec import JobSpec


@dataclass(frozen=True, slots=True)
class InPlace:
    process_share: float     # of all failures: a process on healthy nodes (p)
    restarts: int            # torchrun's restarts per launch, where they apply (K)
    spares: int              # spare nodes (S)

    @property
    def applies(self) -> bool:
        """Whether the share changes anything: process failures are declared and some budget
        keeps failures in the allocation (with neither budget every failure is requeued)."""
        return self.process_share > 0 and (self.restarts > 0 or self.spares > 0)

    def _cycle(self) -> tuple[float, float, float]:
        p = self.process_share
        launch = sum(p ** t for t in range(self.restarts + 1))          # E[T]
        spent = p ** (self.restarts + 1)                                 # a
        launches = sum((1 - spent) ** n for n in range(self.spares + 1))  # E[N]
        return launch, spent, launches

    def requeued(self) -> float:
        """The long-run share of all failures that are requeued."""
        launch, _, launches = self._cycle()
        return 1.0 / (launch * launches)

    def process_in_place(self) -> float:
        """The share of process failures restarted in place."""
        launch, spent, _ = self._cycle()
        return 1.0 - spent / (self.process_share * launch) if self.process_share else 0.0

    def node_in_place(self) -> float:
        """The share of node failures a spare takes."""
        launch, spent, launches = self._cycle()
        nodes = (1.0 - self.process_share) * launch * launches
        return 1.0 - (1.0 - spent) ** (self.spares + 1) / nodes if nodes > 0 else 0.0

    def figures(self) -> dict[str, Any]:
        """For --json: the share and what it comes to."""
        return {"process_failure_share": self.process_share, "restarts_in_place": self.restarts,
                "spare_nodes": self.spares, "applies": self.applies,
                "in_place": 1.0 - self.requeued(),
                "process_in_place": self.process_in_place(),
                "node_in_place": self.node_in_place()}


def shares_run_folder(spec: JobSpec, backend: str) -> bool:
    """Whether `backend`'s nodes share the run folder at the spec's site, as the node contract
    takes it (jobgen/payloads/node.py): the backend answers (its declaration, or its site).
    tests/test_plan_process_failures.py holds the two together."""
    from .. import backends
    return backends.shares_run_folder(backend, spec.site)


def restarts_that_apply(spec: JobSpec, backend: str) -> int:
    """job.restarts_in_place where the backend's nodes share the run folder, else 0."""
    wanted = spec.recipe.job.restarts_in_place
    return wanted if wanted and shares_run_folder(spec, backend) else 0


def notes(found: InPlace, wanted: int, backend: str, basis: str, detect_s: float,
          rendezvous_s: float) -> list[str]:
    """What the plan says about restarts in place: the spares' line, and where a
    process-failure share is declared, what becomes of those failures."""
    out: list[str] = []
    spares = found.spares
    if spares and not found.applies:
        out.append(f"job.spare_nodes={spares}: every count below is billed with {spares} "
                   f"spare node(s); of every {spares + 1} node failures, "
                   f"{spares} restart in place (detect {detect_s:g} + "
                   f"rendezvous {rendezvous_s:g} s, plus the checkpoint load) and one is "
                   "requeued (a spare's own failure is not modelled)")
    elif spares:
        out.append(f"job.spare_nodes={spares}: every count below is billed with {spares} "
                   "spare node(s) (a spare's own failure is not modelled)")
    if not found.process_share:
        return out
    share = (f"{100 * found.process_share:g} % of failures are a process's on healthy nodes "
             f"({basis})")
    why = (f"job.restarts_in_place={wanted} does not apply on {backend} (its nodes do not share "
           "the run folder)" if wanted and not found.restarts else "job.restarts_in_place=0")
    if not found.applies:
        out.append(f"{share}; {why}: each is requeued, as a node's failure is")
        return out
    if found.restarts:
        budget = (f"job.restarts_in_place={found.restarts}: the first {found.restarts} of a "
                  "torchrun launch restart in place, the next is requeued; a requeue or a "
                  "spare's relaunch starts a fresh launch")
    else:
        budget = f"{why}: each is requeued (a spare replaces lost nodes only)"
    nodes = (f" and {100 * found.node_in_place():.1f} % of node failures" if found.spares
             else "")
    out.append(f"{share}; {budget}. In the long run {100 * found.process_in_place():.1f} % of "
               f"process failures{nodes} restart in place (detect {detect_s:g} + rendezvous "
               f"{rendezvous_s:g} s, plus the checkpoint load) and {100 * found.requeued():.1f} % "
               "of all failures are requeued (docs/planning.md)")
    return out


def model(spec: JobSpec, backend: str, site: Site,
          option: Optional[float]) -> tuple[InPlace, list[str]]:
    """The share (--process-failure-share, else the site's plan.process_failure_share) and the
    budgets of `spec` on `backend`, with the plan's notes on them."""
    share = site.plan.process_failure_share if option is None else option
    basis = ("--process-failure-share" if option is not None
             else f"site {site.name} plan.process_failure_share")
    wanted = spec.recipe.job.restarts_in_place
    found = InPlace(share, restarts_that_apply(spec, backend), spec.recipe.job.spare_nodes)
    r = site.plan.restart
    return found, notes(found, wanted, backend, basis, r.detect_s, r.rendezvous_s)
