"""How long to sample: a first look, then longer while a rank leads but not clearly (issue 35).

A clear straggler separates from its peers in the first seconds; a small one (15% slower) needs
several hundred samples a rank before its lead passes the sampling noise. So the ranks are sampled in
looks: FIRST_LOOK_S first, then, while the judge says `unsettled` (a rank ahead short of the margin,
ahead in part of the window only, the healthy ranks too scattered to tell, or samples still too few to
have seen a small straggler: judge._too_short), again for as long as
has been sampled so far, at twice the rate (the sampling error falls with the samples, not the
seconds), until the caller's bound (window_s). Each look's reports are merged with the
earlier ones (same host and pid: samples add up, counters average over time) and judged whole, so
the sampling error shrinks with every look. The answer says how long it sampled and why.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from .judge import Judgement, Rules, judge
from .models import NodeReport, NodeSample, RankSample

FIRST_LOOK_S = 6.0
MAX_RATE_HZ = 20           # a longer look samples at twice the caller's rate, up to this (~1 ms of CPU a sample)
PARTS = 3                  # the merged window is judged in thirds, as one look is (node.PARTS)


@dataclass
class Looked:
    reports: list[NodeReport]
    problems: list[str]
    verdict: Judgement
    looks_s: list[float] = field(default_factory=list)     # each look's length, s

    def sentence(self, bound_s: float) -> str:
        """How long it sampled and why it stopped there (the answer states it)."""
        total, v = sum(self.looks_s), self.verdict
        if v.stragglers:
            why = "a straggler stood out"
        elif v.unsettled and v.inconclusive:
            why = "still unsettled at the bound: the answer above is what the samples so far support"
        elif v.unsettled:
            # The headline says "No straggler": a lead that came and went, or stayed under the bar, over the whole
            # bound is no straggler's; "still unsettled" under it read as a contradiction (model round 7, a healthy
            # job: "the headline and the footnote pull against each other").
            why = ("at the bound no rank's lead held through the window, so none is named; a steady straggler "
                   "smaller than the bar would need a longer window_s")
        else:
            why = "no rank led the others"
        if len(self.looks_s) == 1:
            return f"Sampled {total:.0f} s in one look (bound {bound_s:.0f} s): {why}."
        return (f"Sampled {total:.0f} s in {len(self.looks_s)} looks ({' + '.join(f'{s:.0f}' for s in self.looks_s)} s, "
                f"bound {bound_s:.0f} s; a rank led unclearly or the ranks scattered after {self.looks_s[0]:.0f} s): {why}.")


def plan(bound_s: float, sampled_s: float) -> float:
    """The next look's length: the first look, then as long as sampled so far (doubling), within the bound."""
    if not sampled_s:
        return min(bound_s, FIRST_LOOK_S)
    return min(bound_s - sampled_s, sampled_s)


def look(sample: Callable[[float, int], tuple[list[NodeReport], list[str]]], bound_s: float, rate_hz: int,
         rules: Rules, progress: Callable[[float, str], None] = lambda f, m: None) -> Looked:
    """Sample (seconds, rate) in looks until the judge settles or bound_s is sampled; the merged reports and verdict."""
    done: Looked | None = None
    while True:
        seconds = plan(bound_s, sum(done.looks_s) if done else 0.0)
        reports, problems = sample(seconds, rate_hz if done is None else max(rate_hz, min(2 * rate_hz, MAX_RATE_HZ)))
        if done is None:
            done = Looked(reports, problems, Judgement(), [seconds])
        else:
            done.reports = merge(done.reports, reports, sum(done.looks_s), seconds)
            done.problems += [p for p in problems if p not in done.problems]
            done.looks_s.append(seconds)
        done.verdict = judge(done.reports, rules, sum(done.looks_s))
        left = bound_s - sum(done.looks_s)
        if not done.verdict.unsettled or left < 1:
            return done
        progress(min(0.9, sum(done.looks_s) / bound_s), f"no clear answer after {sum(done.looks_s):.0f} s: sampling "
                 f"{plan(bound_s, sum(done.looks_s)):.0f} s more (bound {bound_s:.0f} s)")


def _weighted(a: float | None, b: float | None, wa: float, wb: float) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    return round((a * wa + b * wb) / (wa + wb), 3)


def _thirds(parts: list[dict[str, float]], samples: list[int]) -> tuple[list[dict[str, float]], list[int]]:
    """Consecutive parts regrouped into PARTS contiguous groups of about equal samples."""
    total = sum(samples)
    if len(parts) <= PARTS or not total:
        return parts, samples
    groups: list[list[int]] = [[] for _ in range(PARTS)]
    seen = 0
    for i, n in enumerate(samples):
        groups[min(PARTS - 1, int(PARTS * (seen + n / 2) / total))].append(i)
        seen += n
    out_parts, out_samples = [], []
    for g in (g for g in groups if g):
        n = sum(samples[i] for i in g)
        keys = {k for i in g for k in parts[i]}
        out_parts.append({k: round(sum(parts[i].get(k, 0) * samples[i] for i in g) / max(n, 1), 3) for k in keys})
        out_samples.append(n)
    return out_parts, out_samples


def merge_rank(a: RankSample, b: RankSample, wa: float, wb: float) -> RankSample:
    """One rank over two consecutive looks of wa and wb seconds."""
    n = a.samples + b.samples
    row = b.model_copy(deep=True)
    row.samples = n
    keys = set(a.fractions) | set(b.fractions)
    row.fractions = {k: round((a.fractions.get(k, 0) * a.samples + b.fractions.get(k, 0) * b.samples) / n, 3)
                     for k in keys} if n else {}
    row.part_fractions, row.part_samples = _thirds(a.part_fractions + b.part_fractions, a.part_samples + b.part_samples)
    if len(a.part_cpu) == len(a.part_fractions) and len(b.part_cpu) == len(b.part_fractions):
        # CPU per part regrouped like the shares (weighted by samples: within a look, by its seconds)
        cpu, _ = _thirds([{"cpu": c} for c in a.part_cpu + b.part_cpu], a.part_samples + b.part_samples)
        row.part_cpu = [round(c.get("cpu", 0.0), 3) for c in cpu]
    else:
        row.part_cpu = []
    row.top_frames = {**b.top_frames, **a.top_frames}
    for name in ("cpu_fraction", "runqueue_wait_fraction", "cgroup_throttled_fraction", "others_runnable", "job_runnable"):
        setattr(row, name, _weighted(getattr(a, name), getattr(b, name), wa, wb))
    row.competitors = b.competitors or a.competitors          # who: the latest look's, its counts its own
    row.error = "" if n else (b.error or a.error)
    return row


def merge_node(a: NodeSample, b: NodeSample, wa: float, wb: float) -> NodeSample:
    row = b.model_copy(deep=True)         # load, PSI, memory: the latest reading
    for name in ("steal_fraction", "tcp_retrans_per_s", "tx_mb_s"):
        setattr(row, name, _weighted(getattr(a, name), getattr(b, name), wa, wb))
    row.shaped_links = list(dict.fromkeys(a.shaped_links + b.shaped_links))
    row.sampler_cpu_s = round((a.sampler_cpu_s or 0) + (b.sampler_cpu_s or 0), 2)
    row.errors = list(dict.fromkeys(a.errors + b.errors))
    return row


def merge(earlier: list[NodeReport], later: list[NodeReport], wa: float, wb: float) -> list[NodeReport]:
    """Reports of two consecutive looks as one; a node or rank seen in one look only is kept as it was."""
    by_host = {r.host: r for r in earlier}
    out = []
    for rep in later:
        old = by_host.pop(rep.host, None)
        if old is None:
            out.append(rep)
            continue
        ranks = {r.pid: r for r in old.ranks}
        merged = [merge_rank(ranks.pop(r.pid), r, wa, wb) if r.pid in ranks else r for r in rep.ranks]
        out.append(NodeReport(host=rep.host, ranks=merged + list(ranks.values()), gpus=rep.gpus or old.gpus,
                              node=merge_node(old.node, rep.node, wa, wb), flight=rep.flight or old.flight))
    return out + list(by_host.values())
