"""Each word the records hold, as a badge: its kind (the colour and the mark before it) and
its Chinese. Standard library, so that the evidence page, rendered by the verifier with no
Django, shows a state exactly as the dashboard does.

The dashboard's badges take their kind from ``KINDS``; its Chinese comes from the catalogue,
and a test holds ``CHINESE`` to it (docs/glossary.md fixes both).
"""

from __future__ import annotations

import dataclasses

# What each word's badge is: ok (✓), warn (▲), bad (✕), info (◆); a word not here is neutral (○).
# A state of ``STATES`` is drawn from that table instead, on the dashboard and on a v2 evidence
# page; its kind here is what a v1 evidence page (0.1.0's) drew, kept so that page still verifies.
KINDS: dict[str, str] = {
    "committed": "ok",
    "reuse": "ok",
    "created": "ok",
    "reused": "info",
    "prepared": "warn",
    "unknown": "warn",
    "query": "info",
    "confirm": "warn",
    "retry": "info",
    "rejected": "bad",
    "stop": "bad",
    "conflict": "bad",
    "failed": "bad",
    "error": "bad",
    "warning": "warn",
    "tampered": "bad",
    "unverified": "warn",
    "disputed": "bad",
    # a person's decision: their word, not the receipt's proof
    "settled: committed": "info",
    "settled: rejected": "info",
    "in doubt": "warn",
    "ok": "ok",
    "keep": "neutral",
    "strip_bodies": "info",
    "archive": "warn",
    # a host's importer
    "shipping": "ok",
    "silent": "bad",
    "stopped": "bad",
    "one-off": "neutral",
    # what a target shows about a call in doubt: facts, neither good nor bad
    "present": "info",
    "absent": "info",
    "unclear": "warn",
}

# The Chinese of every word the dashboard translates (evidence.words.i18n.WORDS); English is the word itself.
CHINESE: dict[str, str] = {
    "committed": "已提交",
    "prepared": "已准备",
    "rejected": "已拒绝",
    "unknown": "未知",
    "failed": "失败",
    "missing": "缺失",
    "reuse": "复用",
    "query": "查询",
    "confirm": "人工确认",
    "retry": "重试",
    "stop": "停止",
    "created": "新建",
    "reused": "复用",
    "conflict": "冲突",
    "reserved": "已预留",
    "task_created": "任务已创建",
    "error": "错误",
    "warning": "警告",
    "tampered": "篡改",
    "unverified": "未验证",
    "disputed": "有争议",
    "verified": "已验证",
    "settled: committed": "已裁定：已提交",
    "settled: rejected": "已裁定：已拒绝",
    "in doubt": "存疑",
    "ok": "正常",
    "keep": "保留",
    "strip_bodies": "清除正文",
    "archive": "归档",
    "archived": "已归档",
    "shipping": "传送中",
    "silent": "失联",
    "stopped": "已停止",
    "one-off": "单次",
    "present": "存在",
    "absent": "不存在",
    "unclear": "不明",
    "live": "实时",
    "running": "运行中",
    "finished": "已结束",
    "abandoned": "已放弃",
    "retrying": "重试中",
    "succeeded": "已成功",
    "completed": "已完成",
    "cancelled": "已取消",
    "acknowledged": "已知悉",
    "snoozed": "已暂缓",
    "open": "未处理",
    "stale reservation": "滞留的预留",
}


@dataclasses.dataclass(frozen=True)
class State:
    """What a call (or an inbox item) shows as, everywhere it is shown: its word, its tone (the
    badge's colour), its own glyph and the bar's marks (so that no two states look alike without
    colour), and the one sentence that says what a person does about it, in each language."""

    name: str  # what records, downloads, the API and the exports hold
    tone: str  # ok, warn, bad, info or neutral: the colour only
    glyph: str  # before the word on every page; one per state
    marks: str  # the status bar's marks over the colour (evidence/web/charts.py draws each)
    words: dict[str, str]  # "en" and "zh-Hans"
    todo: dict[str, str]  # what to do, in each language

    def word(self, language: str) -> str:
        return self.words.get(language, self.words["en"])

    def to_do(self, language: str) -> str:
        return self.todo.get(language, self.todo["en"])


def _state(name: str, tone: str, glyph: str, marks: str, todo_en: str, todo_zh: str) -> State:
    return State(name, tone, glyph, marks, {"en": name, "zh-Hans": CHINESE[name]}, {"en": todo_en, "zh-Hans": todo_zh})


# The one table of states (issue 37). A call shows as one of the first seven
# (``recovery.shown_status``); an inbox item about a submission as conflict or stale. A state a
# page shows that is not here is a defect (tests/test_states.py crawls every page for one).
IN_DOUBT, DISPUTED, TAMPERED = "in doubt", "disputed", "tampered"
SETTLED_COMMITTED, SETTLED_REJECTED = "settled: committed", "settled: rejected"
CONFLICT, STALE = "conflict", "stale reservation"
STATES: dict[str, State] = {
    state.name: state
    for state in (
        _state(
            "committed", "ok", "\u2713", "plain",
            "Nothing to do: it happened once, and its receipt proves it.",
            "无需处理：已执行一次，回执可以证明。",
        ),
        _state(
            "rejected", "neutral", "\u2298", "ticks",
            "Nothing to do: the target refused it and nothing happened; the runtime retries it only if the error"
            " says it may.",
            "无需处理：目标拒绝了它，没有产生效果；仅当错误表明可以重试时，运行时才会重试。",
        ),
        _state(
            IN_DOUBT, "warn", "?", "stripes",
            "Needs you: nobody knows whether it happened. Look at the target, then settle it as done or not done;"
            " the run waits for your answer.",
            "需要您处理：无人知道它是否已执行。请查看目标，然后裁定为已执行或未执行；运行正在等待您的答复。",
        ),
        _state(
            DISPUTED, "warn", "\u2260", "dots",
            "Needs you: its receipt says committed and passes its check, but the target does not show the result."
            " Look at the target and settle it. Nothing points to an intruder.",
            "需要您处理：回执显示已提交且通过了校验，但目标上看不到结果。请查看目标并裁定。没有迹象表明有人入侵。",
        ),
        _state(
            TAMPERED, "bad", "\u2715", "crosses",
            "Investigate: its receipt fails its identity check, so it was changed or misfiled after it was"
            " written. It is never reused; find who changed it, and settle the call from the target.",
            "请调查：回执未通过身份校验，写入后被改动或放错了位置。它永远不会被复用；请查明是谁改动的，并根据目标裁定此调用。",
        ),
        _state(
            SETTLED_COMMITTED, "info", "\u2611", "dashes",
            "Nothing to do: a person settled it as done; the runtime reuses its result and never runs it again.",
            "无需处理：已有人裁定为已执行；运行时复用其结果，不会再次执行。",
        ),
        _state(
            SETTLED_REJECTED, "info", "\u2612", "hatch",
            "Nothing to do: a person settled it as not done; the runtime runs it again under the next attempt.",
            "无需处理：已有人裁定为未执行；运行时将在下一次尝试中重新执行。",
        ),
        _state(
            CONFLICT, "bad", "\u21c4", "grid",
            "Needs you: one submission id was sent with two different requests. Find which is meant; the second"
            " is never created.",
            "需要您处理：同一个提交 ID 对应了两个不同的请求。请确认哪一个才是本意；第二个永远不会被创建。",
        ),
        _state(
            STALE, "warn", "\u25f7", "rings",
            "Needs you: a task was reserved long ago and never finished. Resume the run, or settle its call.",
            "需要您处理：某个任务很久以前已预留但从未完成。请恢复运行，或裁定其调用。",
        ),
    )
}  # fmt: skip
