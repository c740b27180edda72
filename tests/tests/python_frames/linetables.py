# Dumps the line tables of every function of a few standard modules, with the line the
# interpreter gives each instruction: one JSON line per code object, for the decoder's test.
import json
import sys
import types

MODULES = ["json.decoder", "argparse", "textwrap", "dataclasses", "asyncio.base_events", "email.message"]


def codes(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes(c)


for name in MODULES:
    module = __import__(name, fromlist=["_"])
    with open(module.__file__, encoding="utf-8") as f:
        top = compile(f.read(), module.__file__, "exec")
    for code in codes(top):
        if sys.version_info >= (3, 11):
            # One position per code unit, caches included: (start line, end line, cols).
            lines = [p[0] for p in code.co_positions()]
            unit = "index"
        else:
            lines = {}
            for start, end, line in code.co_lines():
                for off in range(start, end, 2):
                    lines[off] = line
            lines = [lines.get(off) for off in range(0, len(code.co_code), 2)]
            unit = "bytes"
        print(json.dumps({
            "version": list(sys.version_info[:2]),
            "name": code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
            "first": code.co_firstlineno,
            "table": code.co_linetable.hex(),
            "unit": unit,
            "lines": lines,
        }))
