"""The restart detector of jobgen watch (the rules: watching/detectors.py): a node that ends
`restarts_per_node` allocations of the job by failing first. A mixin of `Detectors`, which
holds the state declared here."""
from __future__ import annotations

from typing import Optional, Sequence

from ..plumbing.render import shell_quote
from .observations import Alert
from .readers import NodeEnd
from .rules import Rules


class RestartDetector:
    rules: Rules
    now: float
    bad_hosts: set[str]

    def restarts(self, ended: Sequence[Sequence[NodeEnd]],
                 blamed: Optional[dict[int, int]] = None) -> list[Alert]:
        """`ended`: for each finished allocation, how its nodes ended; `blamed`: allocation ->
        the node a hang was pinned on. A node caused an allocation's end when it failed by
        itself (an exit status 1-127, not a signal from the others being stopped)."""
        counts: dict[str, list[int]] = {}
        for index, nodes in enumerate(ended):
            failed = sorted((n for n in nodes if n.status is not None and 0 < n.status < 128),
                            key=lambda n: n.at)
            culprits = failed[:1]   # the first to fail; the others lost their peer
            if blamed and index in blamed:
                culprits += [n for n in nodes if n.node == blamed[index]]
            for end in {(n.host or f"node {n.node}"): n for n in culprits}.values():
                counts.setdefault(end.host or f"node {end.node}", []).append(index)
        alerts = []
        for who, allocations in counts.items():
            if len(allocations) >= self.rules.restarts_per_node and who not in self.bad_hosts:
                self.bad_hosts.add(who)
                drain = ("; drain it: scontrol update "
                         f"{shell_quote('nodename=' + who)} state=drain reason=jobgen-watch"
                         if not who.startswith("node ") else "")
                alerts.append(Alert("bad_node", None, f"{who} ended {len(allocations)} "
                                    f"allocations of this job (restarts "
                                    f"{', '.join(map(str, allocations))}){drain}",
                                    self.now, host=who if not who.startswith("node ") else None,
                                    values={"allocations": allocations}))
        return alerts
