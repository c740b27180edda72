"""memray's peak view of a capture, as JSON on stdout: the bytes live at memray's high-water mark
by location (the innermost Python frame: file, line, function), for the malloc family only — the
allocations memsight's heap counts (memray also records mmap; memsight's heap does not)."""

import collections
import json
import sys

from memray import FileReader
from memray._memray import AllocatorType

reader = FileReader(sys.argv[1])
by = collections.Counter()
for record in reader.get_high_watermark_allocation_records(merge_threads=True):
    if AllocatorType(record.allocator) in (AllocatorType.MMAP, AllocatorType.MUNMAP):
        continue
    stack = record.stack_trace()
    function, file, line = stack[0] if stack else ("?", "?", 0)
    by[(file, line, function)] += record.size
print(json.dumps([
    {"file": f, "line": l, "function": fn, "bytes": b}
    for (f, l, fn), b in by.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 10)
]))
