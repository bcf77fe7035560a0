"""The evidence page (``index.html``), rendered from what ``evidence.json`` holds and nothing else.

The export writes the page with ``render``; ``verify_export`` renders it again from the
evidence.json beside it and compares the bytes. So a page that says anything evidence.json does
not (a ``tampered`` badge turned ``verified``, every ``committed`` turned ``rejected``, a row
taken out, a stylesheet that hides one) fails verification, in either language, even with the
manifest's page digest rewritten to match.

Standard library only: the verifier runs where only the writer is installed. The page's words
are here in both languages, the badges' kinds and Chinese in ``states``, and its stylesheet is
its own (the dashboard's colours and marks): nothing the page shows comes from outside this file
and the evidence.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from html import escape
from typing import Any

from receipts import protocol, states

FORMAT = "callproof-evidence/v1"  # evidence.json's
SECTIONS = ("run", "calls", "submissions", "events", "findings", "confirmations")
# v2 draws each state as the table of states says (receipts/states.py: its own glyph and tone);
# v1, what 0.1.0 exported, badges by kind. A page names its format, and the verifier renders
# each as it was made, so that an export made by an earlier version still verifies.
PAGE_FORMAT = "callproof-evidence-page/v2"
PAGE_FORMATS = ("callproof-evidence-page/v1", PAGE_FORMAT)
LANGUAGES = ("en", "zh-Hans")
PAGE_ROWS = 1000  # the page shows this many of each list; evidence.json has them all
LISTED = ("calls", "submissions", "findings", "confirmations")  # the lists the page shows rows of

# Every sentence of the page, in each language. Values are put in escaped; the sentences' own
# markup (a <code>, a <span translate="no">) is ours.
TEXT: dict[str, dict[str, str]] = {
    "en": {
        "title": "Evidence · run {run_id}",
        "brand": "Callproof evidence",
        "heading": 'Evidence of run <span translate="no">{run_id}</span>',
        "lead": "What this run's agent did, as its run directory recorded it. Arguments, results, reasons and "
        "free text are replaced by <code>sha256:</code> digests of their canonical JSON: whoever holds the "
        "original can prove what it was. Ids, digests, statuses, tools, times and counts are shown.",
        "verdict": "Verdict",
        "state": "State",
        "state_value": "{state}, attempts {attempts}",
        "contract": "Contract",
        "events": "Events",
        "events_value": "{n} (from {first} to {last})",
        "calls": "Calls",
        "calls_some": "Calls (the first {shown}; evidence.json has all {n})",
        "submissions": "Submissions",
        "submissions_some": "Dispositions of task submissions (the first {shown}; evidence.json has all {n})",
        "open_findings": "Open findings",
        "findings_some": "Open findings (the first {shown}; evidence.json has all {n})",
        "confirmations": "Confirmations",
        "confirmations_some": "Confirmations by a person (the first {shown}; evidence.json has all {n})",
        "dispositions": "Dispositions of task submissions",
        "no_task": "no task",
        "seq": "Seq",
        "time": "Time",
        "disposition": "Disposition",
        "action_taken": "Action taken",
        "request_digest": "Request digest",
        "reason": "Reason",
        "yes": "yes",
        "no": "no",
        "no_event": "No event.",
        "no_submissions": "No submissions.",
        "call": "Call",
        "tool": "Tool",
        "attempt": "Attempt",
        "status": "Status",
        "identity": "Identity",
        "input_digest": "Input digest",
        "output_digest": "Output digest",
        "decision": "Decision",
        "does_not_verify": "does not verify",
        "no_calls": "No calls.",
        "code": "Code",
        "severity": "Severity",
        "subject": "Subject",
        "stored": "Stored",
        "recomputed": "Recomputed",
        "none": "None.",
        "confirmations_by_a_person": "Confirmations by a person",
        "resolution": "Resolution",
        "valid": "Valid",
        "when": "When",
        "receipt_digest_seen": "Receipt digest seen",
        "how_to_check": "How to check this evidence",
        "check_sections": "Every section of <code>evidence.json</code> is canonical JSON (<code>json.dumps(value, "
        'sort_keys=True, ensure_ascii=False, separators=(",", ":"))</code>, UTF-8). Its SHA-256 must be the one '
        "below.",
        "check_whole": 'The whole digest is the SHA-256 of the canonical JSON of <code>{{"format", "sections", '
        '"policy"}}</code> from the manifest.',
        "check_page": "This page is rendered from <code>evidence.json</code> alone: <code>callproof "
        "verify-evidence DIR</code> renders it again and compares every byte, so a page that says anything "
        "evidence.json does not fails. Add <code>--against RUN_DIR</code> to compare every digest and call_id "
        "with the original run directory.",
        "manifest": 'Manifest (<span translate="no">{source}</span>)',
    },
    "zh-Hans": {
        "title": "证据 · 运行 {run_id}",
        "brand": "Callproof 证据",
        "heading": '运行 <span translate="no">{run_id}</span> 的证据',
        "lead": "此运行的智能体做了什么，以其运行目录的记录为准。参数、结果、原因和自由文本已替换为其规范 JSON 的 "
        "<code>sha256:</code> 摘要：持有原文的人可以证明原文是什么。ID、摘要、状态、工具、时间和计数照原样显示。",
        "verdict": "结论",
        "state": "状态",
        "state_value": "{state}，尝试次数 {attempts}",
        "contract": "契约",
        "events": "事件",
        "events_value": "{n}（从 {first} 到 {last}）",
        "calls": "调用",
        "calls_some": "调用（前 {shown} 个；evidence.json 含全部 {n} 个）",
        "submissions": "提交请求",
        "submissions_some": "任务提交请求的处置（前 {shown} 个；evidence.json 含全部 {n} 个）",
        "open_findings": "未关闭的发现",
        "findings_some": "未关闭的发现（前 {shown} 个；evidence.json 含全部 {n} 个）",
        "confirmations": "确认记录",
        "confirmations_some": "人工确认记录（前 {shown} 个；evidence.json 含全部 {n} 个）",
        "dispositions": "任务提交请求的处置",
        "no_task": "无任务",
        "seq": "序号",
        "time": "时间",
        "disposition": "处置",
        "action_taken": "已执行操作",
        "request_digest": "请求摘要",
        "reason": "理由",
        "yes": "是",
        "no": "否",
        "no_event": "无事件。",
        "no_submissions": "无提交请求。",
        "call": "调用",
        "tool": "工具",
        "attempt": "尝试",
        "status": "状态",
        "identity": "身份",
        "input_digest": "输入摘要",
        "output_digest": "输出摘要",
        "decision": "决策",
        "does_not_verify": "校验未通过",
        "no_calls": "没有调用。",
        "code": "代码",
        "severity": "严重程度",
        "subject": "对象",
        "stored": "存储值",
        "recomputed": "重算值",
        "none": "无。",
        "confirmations_by_a_person": "人工确认记录",
        "resolution": "裁定结果",
        "valid": "有效",
        "when": "时间",
        "receipt_digest_seen": "所见回执摘要",
        "how_to_check": "如何校验此证据",
        "check_sections": "<code>evidence.json</code> 的每个部分都是规范 JSON（<code>json.dumps(value, sort_keys=True, "
        'ensure_ascii=False, separators=(",", ":"))</code>，UTF-8），其 SHA-256 必须与下表一致。',
        "check_whole": '整体摘要是清单中 <code>{{"format", "sections", "policy"}}</code> 的规范 JSON 的 SHA-256。',
        "check_page": "本页仅由 <code>evidence.json</code> 生成：<code>callproof verify-evidence DIR</code> "
        "会重新生成本页并逐字节比对，因此本页若有任何 evidence.json 没有的内容，校验即失败。加上 "
        "<code>--against RUN_DIR</code> 可将每个摘要和 call_id 与原始运行目录比对。",
        "manifest": '清单（<span translate="no">{source}</span>）',
    },
}

# The page's own stylesheet: the dashboard's colours, badges and tables (static/css/site.css),
# and print rules. Fixed here, so that no edited stylesheet can hide or relabel what the page says.
STYLE = """\
:root { --bg: #ffffff; --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --panel: #f6f8fa; --row: #fbfcfd;
  --ok: #116329; --warn: #7d4e00; --bad: #a40e26; --info: #0550ae;
  --ok-bg: #dafbe1; --warn-bg: #fff8c5; --bad-bg: #ffebe9; --info-bg: #ddf4ff; --neutral-bg: #eaeef2;
  font-family: system-ui, -apple-system, "Segoe UI", sans-serif; font-size: 14px; line-height: 1.45; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0d1117; --fg: #e6edf3; --muted: #9198a1; --line: #30363d; --panel: #161b22; --row: #11161d;
    --ok: #3fb950; --warn: #d29922; --bad: #ff7b72; --info: #79c0ff;
    --ok-bg: #12261e; --warn-bg: #272115; --bad-bg: #2d1416; --info-bg: #0c2d4b; --neutral-bg: #21262d; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); }
html:lang(zh-Hans) { font-family: system-ui, "PingFang SC", "Microsoft YaHei", "Noto Sans CJK SC", sans-serif; }
html:lang(zh-Hans) th { word-break: keep-all; }
code { font-family: ui-monospace, "SF Mono", Menlo, Consolas, monospace; font-size: 0.92em; }
header.site { padding: .5rem 1.2rem; border-bottom: 1px solid var(--line); background: var(--panel); }
header.site .brand { font-weight: 700; font-size: 1.05rem; }
main { padding: .8rem 1.2rem 3rem; max-width: 1500px; }
h1 { font-size: 1.35rem; margin: .3rem 0 .8rem; }
h2 { font-size: 1.08rem; margin: 1.6rem 0 .5rem; }
h3 { font-size: 1rem; margin: .6rem 0 .3rem; }
.lead { font-size: 1.02rem; }
.evidence-note { max-width: 52rem; }
time { white-space: nowrap; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: .3rem 0 .6rem; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
article.submission { border: 1px solid var(--line); border-radius: 6px; padding: .3rem .8rem .5rem; margin: .6rem 0; }
table.data { border-collapse: collapse; width: 100%; margin: .3rem 0 .6rem; }
table.data th, table.data td { text-align: left; padding: .28rem .5rem; border-bottom: 1px solid var(--line);
  vertical-align: top; }
table.data thead th { background: var(--panel); font-weight: 600; }
table.data tbody tr:nth-child(even) { background: var(--row); }
table.data caption { text-align: left; font-weight: 600; padding: .2rem 0; }
table.compact { width: auto; }
.num { text-align: right !important; font-variant-numeric: tabular-nums; }
code.digest { word-break: break-all; font-size: .85em; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 999px; font-size: .82em; font-weight: 600;
  border: 1px solid transparent; white-space: nowrap; }
.badge-ok { background: var(--ok-bg); color: var(--ok); border-color: var(--ok); }
.badge-warn { background: var(--warn-bg); color: var(--warn); border-color: var(--warn); }
.badge-bad { background: var(--bad-bg); color: var(--bad); border-color: var(--bad); }
.badge-info { background: var(--info-bg); color: var(--info); border-color: var(--info); }
.badge-neutral { background: var(--neutral-bg); color: var(--muted); border-color: var(--line); }
.badge::before { content: var(--badge-mark); content: var(--badge-mark) / ""; }
.badge-ok { --badge-mark: "\\2713\\00a0"; }
.badge-warn { --badge-mark: "\\25B2\\00a0"; }
.badge-bad { --badge-mark: "\\2715\\00a0"; }
.badge-info { --badge-mark: "\\25C6\\00a0"; }
.badge-neutral { --badge-mark: "\\25CB\\00a0"; }
/* Small screens: the page never scrolls sideways; a wide table scrolls in its own box. */
@media (max-width: 760px) {
  main { padding: .6rem .7rem 2rem; }
  table.data { display: block; overflow-x: auto; }
  code.digest { word-break: normal; overflow-wrap: anywhere; }
}
@page { size: A4; margin: 16mm; }
@media print {
  header.site { display: none; }
  body { background: #fff; color: #000; font-size: 10pt; }
  table.data { display: table; font-size: 9pt; }
  tr, section { break-inside: avoid; }
}
"""

# What v2 adds to the stylesheet: a state wears its own glyph, in the page.
STATE_STYLE = """\
.badge.state::before { content: none; }
.badge.state .glyph { margin-right: .3em; }
"""

HEX64 = re.compile(r"[0-9a-f]{64}")


def page_language(code: object) -> str:
    """The page's language for a Django language code or a tag: Chinese for any ``zh``, else English."""
    return "zh-Hans" if isinstance(code, str) and code.lower().startswith("zh") else "en"


def render_from(document: dict[str, Any], language: str, page_format: str = PAGE_FORMAT) -> bytes:
    """The page of an evidence.json as parsed: what the verifier compares the page with."""
    lists = {name: items(document.get(name)) for name in LISTED}
    counts = {name: len(document[name]) if isinstance(document.get(name), list) else 1 for name in SECTIONS}
    manifest = mapping(document.get("manifest"))
    run = mapping(document.get("run"))
    return render(
        run=run, rows={name: rows[:PAGE_ROWS] for name, rows in lists.items()}, counts=counts, manifest=manifest,
        language=language, page_format=page_format,
    )  # fmt: skip


def render(
    *,
    run: dict[str, Any],
    rows: dict[str, list[Any]],
    counts: dict[str, int],
    manifest: dict[str, Any],
    language: str,
    page_format: str = PAGE_FORMAT,
) -> bytes:
    """The page: ``run`` the run's record, ``rows`` the first ``PAGE_ROWS`` of each listed section,
    ``counts`` each section's length, ``manifest`` the evidence's manifest; all as canonical JSON
    gives them back (so that the export and the verifier render the same bytes). ``page_format``:
    one of ``PAGE_FORMATS``, as the manifest names it."""
    page = _Page(language, states_drawn=page_format != PAGE_FORMATS[0])
    return page.document(run, rows, counts, manifest).encode("utf-8")


class _Page:
    def __init__(self, language: str, states_drawn: bool = True) -> None:
        self.language = language if language in TEXT else "en"
        self.text = TEXT[self.language]
        self.states_drawn = states_drawn  # v2: a state as the table draws it; v1: by its kind
        self.style = STYLE + STATE_STYLE if states_drawn else STYLE

    def say(self, key: str, **values: str) -> str:
        """A sentence in the page's language, each value already HTML."""
        return self.text[key].format(**values)

    # -- values ---------------------------------------------------------------------------------

    def word(self, value: object) -> str:
        """A record's word in the page's language; a word nobody foresaw as it is."""
        label = as_text(value)
        return states.CHINESE.get(label, label) if self.language == "zh-Hans" else label

    def badge(self, value: object) -> str:
        label = as_text(value) if value not in (None, "") else "missing"
        state = states.STATES.get(label) if self.states_drawn else None
        if state is not None:
            # As the dashboard draws it (evidence/templatetags/dashboard.state_badge).
            named = escape(label)
            glyph = f'<span class="glyph" aria-hidden="true">{state.glyph}</span>'
            return (
                f'<span data-value="{named}" data-state="{named}" class="badge badge-{state.tone} state">'
                f"{glyph}{escape(state.word(self.language))}</span>"
            )
        kind = states.KINDS.get(label, "neutral")
        if label not in states.CHINESE:
            return f'<span class="badge badge-{kind}" translate="no">{escape(label)}</span>'
        return f'<span data-value="{escape(label)}" class="badge badge-{kind}">{escape(self.word(label))}</span>'

    def when(self, value: object) -> str:
        if not isinstance(value, str):
            return "—"
        try:
            moment = protocol.parse_time(value)
        except ValueError:
            return escape(value)
        exact = protocol.format_time(moment)
        return f'<time datetime="{exact}" title="{exact}">{escape(self.shown_time(moment))}</time>'

    def shown_time(self, moment: dt.datetime) -> str:
        """As the dashboard says a time (evidence.words.i18n.shown_time), to the second in UTC."""
        if moment.year < 1000:
            return protocol.human_time(moment)
        if self.language == "zh-Hans":
            return f"{moment.year}年{moment.month}月{moment.day}日 {moment:%H:%M:%S} UTC"
        return f"{moment:%Y-%m-%d %H:%M:%S} UTC"

    def yes_no(self, value: object) -> str:
        return "—" if value is None else self.text["yes"] if value else self.text["no"]

    # -- the page -------------------------------------------------------------------------------

    def document(
        self, run: dict[str, Any], rows: dict[str, list[Any]], counts: dict[str, int], manifest: dict[str, Any]
    ) -> str:
        run_id = escape(as_text(run.get("run_id")))
        parts = [
            "<!doctype html>\n",
            f'<html lang="{self.language}">\n<head>\n<meta charset="utf-8">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            '<meta name="color-scheme" content="light dark">\n',
            f'<meta name="evidence-sha256" content="{escape(as_text(manifest.get("whole")))}">\n',
            f"<title>{self.say('title', run_id=run_id)}</title>\n<style>\n{self.style}</style>\n</head>\n<body>\n",
            f'<header class="site"><span class="brand">{self.say("brand")}</span></header>\n<main id="main">\n',
            f"<h1>{self.say('heading', run_id=run_id)}</h1>\n",
            f'<p class="lead evidence-note">{self.say("lead")}</p>\n',
            self.facts(run, counts),
            self.submissions(rows.get("submissions", []), counts.get("submissions", 0)),
            self.calls(rows.get("calls", []), counts.get("calls", 0)),
            self.findings(rows.get("findings", []), counts.get("findings", 0)),
            self.confirmations(rows.get("confirmations", []), counts.get("confirmations", 0)),
            self.how_to_check(manifest, counts),
            "</main>\n</body>\n</html>\n",
        ]
        return "".join(parts)

    def facts(self, run: dict[str, Any], counts: dict[str, int]) -> str:
        state = self.word(run.get("state")) if run.get("state") not in (None, "") else "—"
        attempts = as_text(run.get("attempts")) if run.get("attempts") is not None else "—"
        by_status = mapping(run.get("calls_by_status"))
        calls = str(counts.get("calls", 0)) + "".join(
            f" · {escape(as_text(n))} {escape(self.word(status))}" for status, n in by_status.items()
        )
        contract = escape(as_text(run.get("contract_sha256"))) if run.get("contract_sha256") else "—"
        events = self.say(
            "events_value",
            n=str(counts.get("events", 0)),
            first=self.when(run.get("first_event_at")),
            last=self.when(run.get("last_event_at")),
        )
        facts = [
            ("verdict", self.badge(run.get("verdict"))),
            ("state", self.say("state_value", state=escape(state), attempts=escape(attempts))),
            ("contract", f'<code class="digest">{contract}</code>'),
            ("events", events),
            ("calls", calls),
            ("submissions", str(counts.get("submissions", 0))),
            ("open_findings", str(counts.get("findings", 0))),
            ("confirmations", str(counts.get("confirmations", 0))),
        ]
        items = "".join(f"  <dt>{self.say(key)}</dt><dd>{value}</dd>\n" for key, value in facts)
        return f'<dl class="facts">\n{items}</dl>\n'

    def heading(self, key: str, some_key: str, shown: int, n: int) -> str:
        if n > shown:
            return self.say(some_key, shown=str(shown), n=str(n))
        return self.say(key)

    def table(self, headings: list[tuple[str, str]], rows: list[str], empty: str, compact: bool = False) -> str:
        head = "".join(f'<th scope="col"{cls}>{self.say(key)}</th>' for key, cls in headings)
        body = "".join(rows) or f'<tr><td colspan="{len(headings)}">{self.say(empty)}</td></tr>'
        kind = "data compact" if compact else "data"
        return f'<table class="{kind}"><thead><tr>{head}</tr></thead>\n<tbody>{body}</tbody></table>\n'

    def submissions(self, submissions: list[Any], n: int) -> str:
        parts = [f"<h2>{self.heading('dispositions', 'submissions_some', len(submissions), n)}</h2>\n"]
        for submission in submissions:
            submission = mapping(submission)
            task = submission.get("task_id")
            task_shown = f'<span translate="no">{escape(as_text(task))}</span>' if task else self.say("no_task")
            history = items(submission.get("history"))
            rows = []
            for event in history:
                event = mapping(event)
                reason = escape(as_text(event.get("reason"))) if event.get("reason") is not None else ""
                rows.append(
                    f'<tr><td class="num">{escape(as_text(event.get("seq")))}</td><td>{self.when(event.get("ts"))}</td>'
                    f"<td>{self.badge(event.get('disposition'))}</td><td>{self.yes_no(event.get('action_taken'))}</td>"
                    f'<td><code class="digest">{escape(short(event.get("request_digest"), 16))}</code></td>'
                    f'<td><span translate="no">{reason}</span></td></tr>\n'
                )
            headings = [("seq", ' class="num"'), ("time", ""), ("disposition", ""), ("action_taken", ""),
                        ("request_digest", ""), ("reason", "")]  # fmt: skip
            parts.append(
                f'<article class="submission">\n<h3><span translate="no">'
                f"{escape(as_text(submission.get('client_submission_id')))}</span> → {task_shown} "
                f"{self.badge(submission.get('state'))}</h3>\n"
                + self.table(headings, rows, "no_event", compact=True)
                + "</article>\n"
            )
        if not submissions:
            parts.append(f"<p>{self.say('no_submissions')}</p>\n")
        return "".join(parts)

    def calls(self, calls: list[Any], n: int) -> str:
        rows = []
        for call in calls:
            call = mapping(call)
            identity = self.word("verified") if call.get("identity_verified") is True else self.say("does_not_verify")
            tool = f"{escape(as_text(call.get('tool')))} {escape(as_text(call.get('tool_version')))}"
            attempt = escape(as_text(call.get("attempt"))) if call.get("attempt") is not None else "—"
            rows.append(
                f'<tr><td><code class="digest">{escape(as_text(call.get("call_id")))}</code></td>'
                f'<td translate="no">{tool}</td><td class="num">{attempt}</td>'
                f"<td>{self.badge(call.get('shown_status'))}</td><td>{escape(identity)}</td>"
                f'<td><code class="digest">{escape(short(call.get("input_sha256"), 16))}</code></td>'
                f'<td><code class="digest">{escape(short(call.get("output_sha256"), 16))}</code></td>'
                f"<td>{self.badge(call.get('decision'))}</td></tr>\n"
            )
        headings = [("call", ""), ("tool", ""), ("attempt", ' class="num"'), ("status", ""), ("identity", ""),
                    ("input_digest", ""), ("output_digest", ""), ("decision", "")]  # fmt: skip
        return f"<h2>{self.heading('calls', 'calls_some', len(calls), n)}</h2>\n" + self.table(
            headings, rows, "no_calls"
        )

    def findings(self, findings: list[Any], n: int) -> str:
        rows = []
        for finding in findings:
            finding = mapping(finding)
            subject = HEX64.sub(lambda match: match.group(0)[:12] + "…", as_text(finding.get("subject")))
            rows.append(
                f"<tr><td><code>{escape(as_text(finding.get('code')))}</code></td>"
                f'<td>{self.badge(finding.get("severity"))}</td><td translate="no">{escape(subject)}</td>'
                f'<td><code class="digest">{escape(as_text(finding.get("stored_value")))}</code></td>'
                f'<td><code class="digest">{escape(as_text(finding.get("recomputed_value")))}</code></td></tr>\n'
            )
        headings = [("code", ""), ("severity", ""), ("subject", ""), ("stored", ""), ("recomputed", "")]
        return f"<h2>{self.heading('open_findings', 'findings_some', len(findings), n)}</h2>\n" + self.table(
            headings, rows, "none"
        )

    def confirmations(self, confirmations: list[Any], n: int) -> str:
        rows = []
        for confirmation in confirmations:
            confirmation = mapping(confirmation)
            rows.append(
                f'<tr><td><code class="digest">{escape(short(confirmation.get("call_id"), 16))}</code></td>'
                f"<td>{self.badge(confirmation.get('resolution'))}</td><td>{self.yes_no(confirmation.get('valid'))}</td>"
                f"<td>{self.when(confirmation.get('confirmed_at'))}</td>"
                f'<td><code class="digest">{escape(as_text(confirmation.get("receipt_sha256")))}</code></td></tr>\n'
            )
        headings = [("call", ""), ("resolution", ""), ("valid", ""), ("when", ""), ("receipt_digest_seen", "")]
        title = self.heading("confirmations_by_a_person", "confirmations_some", len(confirmations), n)
        return f"<h2>{title}</h2>\n" + self.table(headings, rows, "none")

    def how_to_check(self, manifest: dict[str, Any], counts: dict[str, int]) -> str:
        policy = mapping(manifest.get("policy"))
        sections = mapping(manifest.get("sections"))
        rows = [
            f'<tr><th scope="row"><code>whole</code></th><td><code class="digest" data-section="whole">'
            f"{escape(as_text(manifest.get('whole')))}</code></td></tr>\n"
        ]
        rows += [
            f'<tr><th scope="row"><code>{name}</code> ({counts.get(name, 0)})</th><td><code class="digest" '
            f'data-section="{name}">{escape(as_text(sections.get(name)))}</code></td></tr>\n'
            for name in SECTIONS
        ]
        steps = "".join(f"  <li>{self.say(key)}</li>\n" for key in ("check_sections", "check_whole", "check_page"))
        caption = self.say("manifest", source=escape(as_text(policy.get("source"))))
        return (
            f'<h2 id="verify">{self.say("how_to_check")}</h2>\n<ol class="evidence-note">\n{steps}</ol>\n'
            f'<table class="data compact manifest">\n<caption>{caption}</caption>\n<tbody>\n{"".join(rows)}</tbody>\n'
            "</table>\n"
        )


def mapping(value: object) -> dict[str, Any]:
    """An object of evidence.json, or an empty one where an edited file holds something else."""
    return value if isinstance(value, dict) else {}


def items(value: object) -> list[Any]:
    """A list of evidence.json, or an empty one where an edited file holds something else."""
    return value if isinstance(value, list) else []


def as_text(value: object) -> str:
    """Any JSON value as text: a string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


def short(value: object, length: int) -> str:
    """A digest's first characters; nothing for a missing one."""
    return as_text(value)[:length] if value not in (None, "") else ""
