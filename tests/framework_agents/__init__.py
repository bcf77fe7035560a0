"""Agents written with each framework, run as child processes the tests kill and start again.

``python -m tests.framework_agents.FRAMEWORK RUN_DIR [--async] [--twice]`` (FRAMEWORK:
``pydantic_ai``, ``langgraph``, ``openai_agents``) runs one agent run with the framework's
own offline model, scripted: it asks for ``place_order`` (``tools.ORDER_CALL``, a pydantic
model among the arguments), with ``--twice`` asks for the same call again as a framework
does when a tool's response was lost, then answers with the tool results it was given,
as JSON (``tools.final_text``). The run directory reaches the tool through the
framework's per-run context (deps, config, context), never ``use_run``. ``--async`` uses
the ``async def`` tool. The child prints ``tools.finish``'s JSON line: ``{"output": ...}``
and exit 0, or ``{"in_doubt": CALL_ID}`` and exit 3 when ``CallInDoubt`` stopped the run.
"""
