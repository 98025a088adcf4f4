"""review.md and the printed summary, from a Review."""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from typing import Any

from tools.review.report import (
    ASSET_HASH,
    POLICY_KINDS,
    TRUST,
    MachineChange,
    PropertyChange,
    ResourceChange,
    Review,
    Statement,
    references,
)
from tools.review.values import differences

IMPACT = {
    "WILL_CREATE": "add",
    "WILL_UPDATE": "update",
    "WILL_REPLACE": "**replace**",
    "MAY_REPLACE": "**may replace**",
    "WILL_DESTROY": "**delete**",
    "WILL_ORPHAN": "**orphan**",
    "WILL_IMPORT": "import",
    "NO_CHANGE": "no change",
}
# Lines of field differences shown per property; the rest are counted.
DETAIL_LINES = 4
_STACK_OUTPUT = re.compile(
    r'\{\\?"Fn::GetStackOutput\\?":\{\\?"StackName\\?":\\?"([^"\\]+)\\?",'
    r'\\?"Region\\?":\\?"[^"\\]*\\?",\\?"OutputName\\?":\\?"([^"\\]+)\\?"\}\}'
)
_READ = re.compile(r"\$\{([A-Za-z][\w-]*):(\w+)\}")


def summary(review: Review, *, allow_stateful: bool = False) -> str:
    """The summary: printed by `make review` and at the top of review.md. One line when nothing changes."""
    if review.empty:
        line = f"No changes: the working tree synthesizes the same templates as {review.base}."
        return "\n".join([line, *(f"Note: {note}" for note in review.notes)])
    stacks = ", ".join(name if status == "changed" else f"{name} ({status})" for name, status in review.stacks.items())
    lines = [f"Review of the working tree against {review.base}. Stacks that change: {stacks or 'none'}.", ""]
    if review.blocking:
        listed = "; ".join(
            f"{r.stack} `{r.path or r.logical_id}` ({r.type}, {r.logical_id}) {r.ends}"
            + (f": {fate}" if (fate := review.data_fates.get((r.stack, r.logical_id))) else "")
            for r in review.blocking
        )
        verdict = (
            "Allowed by ALLOW_STATEFUL=1."
            if allow_stateful
            else "The review fails (exit 1); once the data plan is agreed, run it with ALLOW_STATEFUL=1."
        )
        lines.append(f"- **Stateful resources replaced or removed**: {listed}. {verdict}")
    if review.resources:
        counts = Counter(_impact_word(r) for r in review.resources)
        stateful = sum(r.stateful is not None for r in review.resources)
        words = ", ".join(f"{counts[w]} {w}" for w in ("added", "removed", "replaced", "updated") if counts[w])
        lines.append(f"- Resources: {words}" + (f"; {stateful} of them stateful." if stateful else "."))
    lines.extend(f"- **Deploy**: {work}." for r in review.resources for work in r.deploy_work)
    if review.asset_moves:
        moved = len(review.asset_moves)
        lines.append(
            f"- IAM: {_count(moved, 'statement')} only {'follows' if moved == 1 else 'follow'} a rebuilt asset to "
            "its new hash: the same grants, not new ones."
        )
    if review.statements or review.managed_policies:
        added = [s for s in review.statements if s.change == "+"]
        flags = Counter(note.split(" (")[0] for s in added for note in s.notes)
        flagged = ", ".join(f"{flag} ({n})" for flag, n in sorted(flags.items()))
        attached = Counter(m.change for m in review.managed_policies)
        lines.append(
            f"- IAM: {_count(len(added), 'statement')} added, {len(review.statements) - len(added)} removed"
            + (f"; the added ones grant: {flagged}" if flagged else "")
            + (f"; managed policies: {attached['+']} attached, {attached['-']} detached" if attached else "")
            + "."
        )
    if review.rules:
        added_rules = [r for r in review.rules if r.change == "+"]
        opened = sum(r.open_to_internet for r in added_rules)
        lines.append(
            f"- Security groups: {_count(len(added_rules), 'rule')} added"
            + (f" ({opened} open to the internet)" if opened else "")
            + f", {len(review.rules) - len(added_rules)} removed."
        )
    if review.acknowledgements:
        ack = Counter(a.change for a in review.acknowledgements)
        lines.append(f"- cdk-nag acknowledgements: {ack['+']} added, {ack['-']} removed, {ack['~']} with a new reason.")
    lines.extend(
        f"- State machine `{m.path or m.logical_id}` ({m.stack}): {_machine_summary(m)}." for m in review.machines
    )
    lines.extend(f"- Note: {note}" for note in review.notes)
    return "\n".join(lines)


def render(review: Review, *, allow_stateful: bool = False) -> str:
    """review.md: the summary, then each kind of change in its own section."""
    if review.empty:
        return summary(review) + "\n"
    parts = ["# CloudFormation review", "", summary(review, allow_stateful=allow_stateful)]
    for section in (_stateful, _resources, _iam, _rules, _acknowledgements, _machines):
        parts += section(review)
    if review.other:
        parts += ["", "## Other template changes", "", *(f"- {line}" for line in review.other)]
    return "\n".join(parts) + "\n"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _impact_word(resource: ResourceChange) -> str:
    if resource.change in ("added", "removed"):
        return resource.change
    return "replaced" if resource.impact in ("WILL_REPLACE", "MAY_REPLACE") or resource.ends else "updated"


def _machine_summary(machine: MachineChange) -> str:
    if machine.error:
        return f"definition changed, not compared state by state ({machine.error})"
    if machine.change != "changed":
        return f"{machine.change}, with {_count(machine.state_count, 'state')}"
    counts = Counter(s.change for s in machine.states if s.state != "(start)")
    words = [f"{_count(counts[c], 'state')} {c}" for c in ("added", "removed", "changed") if counts[c]]
    return ", ".join(words) or "start state changed"


def _text(review: Review, value: Any) -> str:
    """Cross-stack reads (the engine leaves them as JSON) as `${stack:what the output holds}`."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = _STACK_OUTPUT.sub(lambda m: f"${{{m.group(1)}:{m.group(2)}}}", text)
    return _READ.sub(lambda m: f"${{{m.group(1)}:{review.outputs.get((m.group(1), m.group(2)), m.group(2))}}}", text)


def _cell(review: Review, value: Any) -> str:
    """Text for a table cell; `<job>` in a reason must not read as an HTML tag."""
    text = html.escape(_text(review, value), quote=False)
    return text.replace("|", "\\|").replace("\n", "<br>")


def _code(review: Review, value: Any) -> str:
    return "`" + _text(review, value).replace("|", "\\|").replace("\n", " ") + "`"


def _name(resource: ResourceChange) -> str:
    return f"`{resource.path}` ({resource.logical_id})" if resource.path else f"`{resource.logical_id}`"


def _construct(review: Review, stack: str, logical_id: str) -> str:
    return f"`{review.paths.get((stack, logical_id), logical_id)}`"


def _property(review: Review, resource: ResourceChange, prop: PropertyChange, replaced: set[str]) -> str:
    impact = {"WILL_REPLACE": " (replace)", "MAY_REPLACE": " (may replace)"}.get(prop.impact or "", "")
    text = f"`{prop.name}`{impact}"
    intrinsic = isinstance(prop.new, dict) and len(prop.new) == 1 and next(iter(prop.new)).startswith("Fn::")
    if prop.old != prop.new and _hashes_only(prop.old, prop.new):
        text += ": only an asset's hash moves (a rebuilt asset)"
    elif prop.old != prop.new and not intrinsic:
        details = differences(prop.old, prop.new, depth=3)
        shown = [_cell(review, d) for d in details[:DETAIL_LINES] if d != "changed"]
        if len(details) > DETAIL_LINES:
            shown.append(f"and {len(details) - DETAIL_LINES} more")
        text += ": " + "; ".join(shown) if shown else ""
    reasons = [
        f"reads {_construct(review, stack, logical_id)} of {stack}, which is replaced"
        for stack, logical_id in prop.replaced_sources
    ]
    if prop.old == prop.new:
        reasons += [
            f"references {_construct(review, resource.stack, logical_id)}, which is replaced"
            for logical_id in sorted(references(prop.new) & replaced)
        ]
    return text + (f" — {'; '.join(reasons)}" if reasons else "")


def _hashes_only(old: Any, new: Any) -> bool:
    """Whether two values differ only in assets' content hashes."""
    old_text, new_text = (json.dumps(v, sort_keys=True) for v in (old, new))
    return ASSET_HASH.search(old_text) is not None and ASSET_HASH.sub("", old_text) == ASSET_HASH.sub("", new_text)


def _table(*headers: str) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]


def _stateful(review: Review) -> list[str]:
    stateful = [r for r in review.resources if r.stateful]
    if not stateful:
        return []
    lines = ["", "## Stateful resources", "", *_table("Stack", "Resource", "Type", "Stateful as", "Change")]
    for r in stateful:
        change = f"**{r.ends}**" if r.ends else {"updated": "updated in place"}.get(r.change, r.change)
        if fate := review.data_fates.get((r.stack, r.logical_id)):
            change += f": {_cell(review, fate)}"
        lines.append(f"| {r.stack} | {_name(r)} | {r.type} | {r.stateful} | {change} |")
    return lines


def _resources(review: Review) -> list[str]:
    lines = ["", "## Resources"] if review.resources else []
    carried = review.carried()
    followers = {id(r) for rows in carried.values() for r in rows}
    for stack in review.stacks:
        rows = [r for r in review.resources if r.stack == stack and id(r) not in followers]
        if not rows:
            continue
        replaced = {r.logical_id for r in review.resources if r.stack == stack and r.impact == "WILL_REPLACE"}
        lines += ["", f"### {stack}", "", *_table("Resource", "Type", "Impact", "What changes")]
        for r in sorted(rows, key=lambda r: (_impact_word(r) != "replaced", r.logical_id)):
            changes = [_property(review, r, p, replaced) for p in r.properties] + [f"`{o}`" for o in r.other]
            changes += [f"**{work}**" for work in r.deploy_work]
            if (r.stack, r.logical_id) in carried:
                changes.append(
                    f"{_count(len(carried[(r.stack, r.logical_id)]), 'resource')} that read it change with it"
                )
            impact = (
                "**replace** (type changed)" if r.old_type and r.old_type != r.type else IMPACT.get(r.impact, r.impact)
            )
            lines.append(f"| {_name(r)} | {r.type} | {impact} | {'<br>'.join(changes) or r.change} |")
    if carried:
        lines += ["", "### What changes only because it reads a replaced resource", ""]
        lines += [f"- {_carried(review, root, rows)}" for root, rows in carried.items()]
    return lines


def _carried(review: Review, root: tuple[str, str], rows: list[ResourceChange]) -> str:
    """One line for the resources a replacement carries with it: how many, replaced or updated, of which types."""
    parts = []
    for word in ("replaced", "updated"):
        kinds = Counter(r.type for r in rows if _impact_word(r) == word)
        if kinds:
            types = ", ".join(f"{n} {t}" for t, n in sorted(kinds.items(), key=lambda item: (-item[1], item[0])))
            parts.append(f"{sum(kinds.values())} {word} ({types})")
    stacks = sorted({r.stack for r in rows} - {root[0]})
    elsewhere = f", some in {', '.join(stacks)}" if stacks else ""
    head = f"{_construct(review, *root)} of {root[0]} is replaced, and with it what reads it{elsewhere}"
    return f"{head}: {'; '.join(parts)}"


def _principal(review: Review, statement: Statement, principal: str) -> str:
    match = re.fullmatch(r"AWS:\$\{([^}.]+)\}", principal)
    if match:
        return _construct(review, statement.stack, match.group(1))
    if principal in ("*", "AWS:*"):
        return "anyone (`*`)"
    # The engine reads a Lambda permission's principal as a service's, whatever it is: an IAM ARN is a role's.
    iam_arn = re.fullmatch(r"(?:AWS|Service):(arn:[\w-]+:iam::\d{12}:(role|user)/(?:[^/]+/)*([^/]+))", principal)
    if iam_arn:
        return f"{iam_arn.group(2)} `{iam_arn.group(3)}` ({_code(review, iam_arn.group(1))})"
    return _code(review, principal)


def _iam(review: Review) -> list[str]:
    if not (review.statements or review.managed_policies or review.asset_moves):
        return []
    lines = ["", "## IAM: who can now do what", ""]
    lines.append("`+` can now, `-` can no longer, as the CDK diff engine reads the statements of each policy.")
    for kind in (TRUST, *dict.fromkeys(POLICY_KINDS.values()), "other resource policies"):
        rows = [s for s in review.statements if s.kind == kind]
        if not rows:
            continue
        lines += ["", f"### {kind[0].upper()}{kind[1:]}", ""]
        lines += _table("", "Who", "Effect", "Actions", "On", "Condition", "Notes")
        for s in sorted(rows, key=lambda s: (s.change != "+", s.principals, s.actions)):
            who = "<br>".join(_principal(review, s, p) for p in s.principals)
            actions = ("NOT " if s.not_actions else "") + "<br>".join(_code(review, a) for a in s.actions)
            on = ("NOT " if s.not_resources else "") + "<br>".join(_code(review, r) for r in s.resources)
            condition = _code(review, s.condition) if s.condition else ""
            notes = ", ".join(f"**{n}**" for n in s.notes) if s.change == "+" else ""
            lines.append(f"| {s.change} | {who} | {s.effect} | {actions} | {on} | {condition} | {notes} |")
    if review.asset_moves:
        holders = Counter(
            _construct(review, s.stack, logical_id) for s in review.asset_moves for logical_id, _ in s.sources
        )
        lines += ["", "Only an asset's hash moves (the same grants on the rebuilt asset) in: "]
        lines[-1] += ", ".join(f"{holder} ({_count(n, 'statement')})" for holder, n in holders.items()) + "."
    if review.managed_policies:
        lines += ["", "### Managed policies", "", *_table("", "Who", "Managed policy")]
        for m in review.managed_policies:
            match = re.fullmatch(r"\$\{([^}.]+)\}", m.identity)
            who = _construct(review, m.stack, match.group(1)) if match else _code(review, m.identity)
            lines.append(f"| {m.change} | {who} | {_code(review, m.policy)} |")
    return lines


def _rules(review: Review) -> list[str]:
    if not review.rules:
        return []
    lines = ["", "## Security groups", "", *_table("", "Group", "Direction", "Protocol", "Peer", "")]
    for r in sorted(review.rules, key=lambda r: (r.change != "+", r.group)):
        match = re.fullmatch(r"\$\{([^}.]+)\.GroupId\}", r.group)
        group = _construct(review, r.stack, match.group(1)) if match else _code(review, r.group)
        flag = "**open to the internet**" if r.open_to_internet and r.change == "+" else ""
        lines.append(f"| {r.change} | {group} | {r.direction} | {r.protocol} | {_code(review, r.peer)} | {flag} |")
    return lines


def _acknowledgements(review: Review) -> list[str]:
    if not review.acknowledgements:
        return []
    lines = ["", "## cdk-nag acknowledgements", "", *_table("", "Construct", "Finding", "Reason")]
    for a in review.acknowledgements:
        reason = _cell(review, a.reason) + (f" (was: {_cell(review, a.old_reason)})" if a.change == "~" else "")
        lines.append(f"| {a.change} | `{a.path}` | `{a.rule.split('::', 1)[-1]}` | {reason} |")
    return lines


def _machines(review: Review) -> list[str]:
    lines = []
    sign = {"added": "+", "removed": "-", "changed": "~"}
    for m in review.machines:
        lines += ["", f"## State machine `{m.path or m.logical_id}` ({m.stack})", ""]
        if m.error or m.change != "changed":
            lines.append(f"The state machine is {_machine_summary(m)}.")
            continue
        lines += _table("", "State", "Type", "What changes")
        for s in m.states:
            details = "<br>".join(_cell(review, d) for d in s.details)
            lines.append(f"| {sign[s.change]} | {_cell(review, s.state)} | {s.type} | {details} |")
    return lines
