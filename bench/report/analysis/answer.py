"""What answer mode settled in a section: the fastest cell of each group, those not told apart from it, each
knob's effect, and whether the answer is settled."""

from __future__ import annotations

import math

import pandas as pd

from ... import stats
from ...judge import blocks, effects
from ...matrix.axes import AXIS as AXIS_TABLE_BY_NAME
from ...matrix.presets import PRESETS
from ...records import quality
from ...records.status import Status
from .values import AXIS_NAMES, Section, records

ANSWER_NOTE = (
    "Judged as answer mode's console judges them: the fastest cell of each group (among the blocks anchors tie "
    "together) with its 95% interval; the cells not told apart from it (the 95% interval of their ratio to it "
    "reaches within compare's 5% minimum effect); the cells no block or anchor ties to it; each knob's effect over "
    "pairs measured in one block, from every measurement of the pair's two cells in the blocks both ran in (named "
    "beside the pairs; the one-knob table below takes each cell's latest attempt, so its ratio for the same pair may "
    "differ), the verdict following from the interval."
)


def _answer(cells: pd.DataFrame, attempts: pd.DataFrame) -> dict | None:
    """What answer mode (`zerobench run --answer`) settled among these cells, from the records, judged as its
    console judges them (bench.judge.blocks, bench.judge.effects): per group its fastest ok cell with a 95% interval,
    the cells not told apart from it and those no block or anchor ties to it; each knob's effect over pairs measured
    in one block; the cells measured and what each role cost (wall seconds of every attempt); the cells left
    unmeasured, those the budget (or a stop) left that could still change the answer, those expected to repeat
    an error (bench.execute.answer.failures), and the predicted time measuring them once would add. "measured" counts
    the cells with an ok record; "attempts" every attempt answer mode made, failures included."""
    if "answer_role" not in cells or cells["answer_role"].isna().all():
        return None
    roles = attempts["answer_role"]
    measured = attempts[roles.notna() & (roles != "unmeasured")]
    left = cells[cells["status"] == Status.UNMEASURED.value]
    needed = left[left["answer_needed"].eq(True)]
    chances = _answer_chances(left)
    judged = _answer_judged(measured, left)
    apart = sum(len(g["apart"]) for g in judged["groups"])
    return {
        **judged,
        "verdict": _answer_verdict(len(needed), chances, _wall_s(needed), apart),
        "measured": int(measured.loc[measured["status"] == Status.OK.value, "cell_hash"].nunique()),
        "attempts": len(measured),
        "cost_s": {str(k): float(v) for k, v in measured.groupby("answer_role")["wall_s"].sum().items()},
        "spent_s": float(measured["wall_s"].sum()),
        "unmeasured": len(left),
        "needed": len(needed),
        "expected": int(left["answer_expected_error"].notna().sum()) if "answer_expected_error" in left else 0,
        "adds_s": float(pd.to_numeric(left["answer_predicted_wall_s"], errors="coerce").sum()),
        "chances": chances,
    }


def random_weights(s: Section) -> bool:
    """The section's model is a preset shape: it starts from random weights, no checkpoint."""
    return s.model in PRESETS


def knobs_aside(s: Section) -> str:
    """What the one-knob table's reader must know beside its method: where its pairs differ from the answer
    section's, and that its losses are a random-weight model's."""
    out = ""
    if s.answer is not None:
        out += (
            " Each pair here is its two cells' latest attempts; the answer section above pairs every measurement of "
            "the two cells in the blocks both ran in, so a ratio for the same pair may differ between the two tables."
        )
    if random_weights(s):
        out += (
            f" The losses are of {s.model}, a preset shape trained from random weights (no checkpoint): a loss "
            "difference says whether two setups train alike from the same start, not how well a real model learns."
        )
    return out


def _wall_s(cells: pd.DataFrame) -> float:
    """The cells' predicted wall seconds (answer mode's note on each unmeasured record)."""
    return float(pd.to_numeric(cells["answer_predicted_wall_s"], errors="coerce").sum())


def _answer_verdict(
    needed: int, chances: tuple[float, float, float] | None, needed_s: float, apart: int = 0
) -> tuple[str, str]:
    """What the answer's reader needs first: settled or not settled, and why, in words (the verdict, the rest).
    apart: measured cells no block or anchor ties to their group's fastest; no chance counts them, so an answer with
    any is not settled, as the console says."""
    lead = "the chance that an unmeasured cell beats its group's fastest by more than the minimum effect is "
    if needed == 0 and not apart and (chances is None or max(chances[:2]) < chances[2]):
        said = (
            f"{lead}{chances[0]:.1%}, that one adds a frontier point {chances[1]:.1%}, each below {chances[2]:.0%}"
            if chances
            else "no unmeasured cell could still change it"
        )
        return "settled", said
    chance = (
        f"{lead}{chances[0]:.1%}, that one adds a frontier point {chances[1]:.1%} (settled means each below "
        f"{chances[2]:.0%}); "
        if chances
        else ""
    )
    untied = (
        f"{apart} measured cell(s) of blocks no anchor ties to their group's fastest compare with it at no chance "
        "(a cell measured in both blocks would tie them); "
        if apart
        else ""
    )
    return "not settled", (
        f"{chance}{untied}{needed} unmeasured cells could still change the answer; measuring each once would take "
        f"about {needed_s / 60:.0f} min of cell time (predicted)"
    )


_ANSWER_FIELDS = [
    "cell_hash", "cell_name", "block", "tokens_per_s", "noise_sd", "answer_group", "peak_memory_source",
    "peak_memory_bytes", "block_label",
]  # fmt: skip


def _answer_chances(left: pd.DataFrame) -> tuple[float, float, float] | None:
    """The joint stopping rule's figures as the search ended (bench.execute.answer.settle): the largest group's chance
    that an unmeasured cell beats its fastest by more than the minimum effect, the chance that one adds a frontier
    point, and the level; None where the records carry none."""
    if "answer_p_lead" not in left or left["answer_p_lead"].isna().all():
        return None
    lead = pd.to_numeric(left["answer_p_lead"], errors="coerce").max()
    front = pd.to_numeric(left["answer_p_frontier"], errors="coerce").max()
    return float(lead), float(front), float(pd.to_numeric(left["answer_settle"], errors="coerce").max())


def _answer_judged(measured: pd.DataFrame, left: pd.DataFrame) -> dict:
    """Per group the fastest cell, its ties and the cells not compared with it; each knob's effect: from the ok
    attempts' measurements by block, as bench.execute.answer judges them."""
    ok = measured[(measured["status"] == Status.OK.value) & (measured["tokens_per_s"] > 0)]
    rows = records(ok, [c for c in _ANSWER_FIELDS if c in ok])
    obs: dict = {}
    for r in rows:
        obs.setdefault(r["cell_hash"], {}).setdefault(r["block"], []).append(
            blocks.Obs(math.log(r["tokens_per_s"]), r["noise_sd"])
        )
    cpu = any(r.get("peak_memory_source") == "host_rss" for r in rows)
    cross = quality.CROSS["cpu" if cpu else "gpu"]
    offs = blocks.offsets(obs, cross, list(dict.fromkeys(r["block"] for r in rows)))
    part = blocks.parts(obs, offs.ref)
    name = {r["cell_hash"]: r["cell_name"] for r in rows}
    peak: dict = {}  # each cell's highest peak over its ok attempts: what it needs
    for r in rows:
        if isinstance(r.get("peak_memory_bytes"), (int, float)) and not math.isnan(r["peak_memory_bytes"]):
            peak[r["cell_hash"]] = max(peak.get(r["cell_hash"], 0), r["peak_memory_bytes"])
    group = {r["cell_hash"]: r["answer_group"] for r in rows if isinstance(r["answer_group"], str)}
    groups = []
    for g in dict.fromkeys(group.values()):
        members = [h for h in obs if group.get(h) == g]
        lead = members[blocks.leading([obs[h] for h in members], offs, cross, part)]
        judged = {h: effects.against(obs[h], obs[lead], offs, cross, part) for h in members if h != lead}
        lo, mid, hi = _level(obs[lead], offs, cross)
        groups.append({
            "group": g, "cell_name": name[lead], "tokens_per_s": mid, "low": lo, "high": hi,
            "repeats": sum(len(v) for v in obs[lead].values()), "peak_memory_bytes": peak.get(lead),
            "ties": [name[h] for h, e in judged.items() if e is not None and e.verdict != effects.SLOWER],
            "apart": [name[h] for h, e in judged.items() if e is None],
        })  # fmt: skip
    label = {r["block"]: r.get("block_label") or r["block"] for r in rows}
    return {"groups": groups, "effects": _answer_effects(measured, left, obs, cross, label), "offsets": offs}


def _level(s: blocks.Sample, offs: blocks.Offsets, cross: float) -> tuple[float, float, float]:
    """A cell's tokens/s with its 95% interval: on the reference block's scale where anchors tie its block to
    it, else as its own block measured it (as answer mode's console shows it)."""
    if set(s) & offs.tied:
        mean, var = blocks.level(s, offs, cross)
    else:
        mean, var = blocks.mean_var(s[max(s, key=lambda b: len(s[b]))])
    z = stats.normal_quantile(effects.CONF) * math.sqrt(var)
    return math.exp(mean - z), math.exp(mean), math.exp(mean + z)


def _answer_effects(measured: pd.DataFrame, left: pd.DataFrame, obs: dict, cross: float, label: dict) -> list[dict]:
    """Each knob value's effect over the pairs measured in one block, among the cells answer mode measured or
    left unmeasured (bench.judge.effects.knob_pairs, knob_effect), and the blocks those pairs ran in (label: a
    block's name in the report)."""
    if "answer_expected_error" in left:  # a cell expected to repeat an error is out of the search, as in answer mode
        left = left[left["answer_expected_error"].isna()]
    live = pd.concat([measured[measured["cell_hash"].isin(obs)], left]).drop_duplicates("cell_hash", keep="first")
    hashes = live["cell_hash"].tolist()
    feats = [effects.features(r) for r in records(live, [a for a in AXIS_NAMES if a in live])]
    out = []
    for axis, value, ref, idx in effects.knob_pairs(feats):
        pairs = [(obs.get(hashes[i], {}), obs.get(hashes[j], {})) for i, j in idx]
        short = AXIS_TABLE_BY_NAME[axis].short
        out.append({
            "axis": axis, "value": value, "reference": ref, "knob": f"{short}={value} vs {short}={ref}",
            "tokens": effects.knob_effect(pairs, cross),
            "blocks": sorted({str(label.get(b, b)) for r, v in pairs for b in set(r) & set(v)}),
        })  # fmt: skip
    return out
