//! The reader that cannot miss a memory failure: any line in the vocabulary of running out of
//! memory (out of memory, OOM, OOMKilled, oom-kill, ALLOC_FAILED, RESOURCE_EXHAUSTED, cannot
//! allocate, ENOMEM, `MemoryError`, would exceed allowed memory, insufficient / not enough / low on
//! memory, …) that no specific reader explains becomes a `generic_oom` finding with every size,
//! device, process and error code it can attribute. A line that gives advice about memory (`if you
//! encounter out of memory …`, `to avoid OOM …`) reports nothing. Specific readers refine: a line
//! within [`NEAR`] lines of a specific message belongs to it.

use super::facts::{Fact, Facts};
use super::scan::{Pattern, Piece};
use super::size::exact_bytes;
use super::Kind;
use regex::Regex;
use std::sync::LazyLock;

/// Words and phrases with which runtimes, drivers, libraries, schedulers and kernels say memory
/// ran out. Matched per line; case-sensitive where the lower-case word means something else.
static VOCABULARY: Pattern = LazyLock::new(|| {
    // A space in a phrase matches any blank or an underscore (`NOT_ENOUGH_MEMORY`, a
    // non-breaking space from a web page).
    regex::RegexBuilder::new(&concat!(
        r"(?i:(?:\b|_)out[ -]of[ -](?:(?:device|gpu|host|shared|cpu|video|graphics|system|physical|virtual|swap|local|global|pinned|managed|unified|heap|java heap|the|available|usable|free|vram|ram|npu|xpu|mlu|musa|tpu) |(?:\w+ ){1,2}(?:and|or|&) (?:\w+ ){0,2})?(?:memory|ram|vram)\b)",
        r"|\bOOM(?:[ -]?[Kk]illed|[ -]?[Kk]ill(?:er|ing)?)?\b",
        r"|(?i:\boom[- ]kill)",
        r"|\b[A-Z0-9_]*_(?:STATUS_)?ALLOC(?:ATION)?_FAIL(?:ED|URE)\b|\bE_OUTOFMEMORY\b|(?i:OutOf[A-Za-z]{0,12}Memory(?:Error|Exception)?)\b",
        r"|(?i:\bresource ?exhausted)",
        r"|\bENOMEM\b|(?i:\[errno 12\]|errno[= ]12\b|error code 12\b)",
        r"|(?i:\b(?:cannot|can't|can not|could ?not|couldn't|unable to|failed to|fails? to) (?:[a-z]+ )?(?:(?:re)?allocate|(?:re)?alloc|map|commit|reserve)\b[^\n]{0,80}?(?:memory|bytes?\b|\d\s?[KMGTP](?:i?B)?\b|array|buffer|tensor|block|pages\b|address space))",
        r"|(?i:\bwould exceed (?:the )?allowed memory)",
        r"|(?i:\b(?:exceed(?:s|ed|ing)?|reach(?:ed|ing)?|over) (?:the |its |their )?(?:[\w%.]+ ){0,2}memory (?:usage )?(?:limit|budget|threshold|quota))",
        r"|(?i:\bmemory (?:usage )?(?:limit|budget) of [^\n]{0,40}?\b(?:exceeded|reached))",
        // A limit qualified in parentheses (ClickHouse's `Memory limit (total) exceeded`, `(for
        // query)`), and an operation's own memory (MySQL's `Out of sort memory`).
        r"|(?i:\bmemory limit \([^)\n]{1,30}\) exceeded|\bout of (?:sort|query|join) memory\b|\bmemory allocation error\b)",
        r"|(?i:\bsystemd-oomd killed\b|\bkilled\b[^\n]{0,300}?\bdue to memory pressure\b)",
        // systemd-oomd's own kill lines, whose reason is on another line or cut off
        // (`systemd-oomd[659]: oomd attempting to kill 407 with KILL`, `systemd-oomd[93234]: Killed
        // /user.slice/…`): it only kills for memory pressure or swap.
        r"|\bsystemd-oomd\[[0-9]+\]: (?:Killed /|oomd attempting to kill [0-9]+)",
        r"|(?i:\bbeyond (?:the )?(?:physical|virtual) memory limit)",
        // The kernel's warning that a page allocation failed (`kswapd0: page allocation failure:
        // order:0, mode:0x40cc0(GFP_KERNEL|__GFP_COMP)`).
        r"|(?i:\bpage allocation failure\b)",
        // A userspace OOM killer's low-memory state (earlyoom's `low memory! at or below SIGTERM
        // limits`): a failure only where the kill it leads to follows ([`monitor_kill_after`]).
        r"|(?i:\blow (?:on )?memory\W{0,3} (?:at or )?below\b)",
        // A batch system's kill for memory (HTCondor's `Job killed by HTCondor due to excessive
        // memory use`) and a job past its maximum memory figure (WMAgent's `Job has exceeded
        // maxPSS: 16000 MB`, a `max RSS` or `maximum VSS`).
        r"|(?i:\b(?:excessive|too much) (?:\w+ )?memory (?:use|usage|consumption)\b)",
        r"|(?i:\bexceed(?:s|ed|ing)? (?:the |its )?-{0,2}max(?:imum)?[ -]?(?:pss|rss|vss|vsize|memory)\b)",
        r"|(?i:\bmem(?:ory)? (?:limit |quota |budget )?(?:exceeded|exhausted)|\bmem(?:ory)? \S+ exceeded (?:the )?limit|\bTERM_MEMLIMIT\b|\bGC overhead limit exceeded|\bpaging file is too small)",
        // A limit's size between the words (PHP's `Allowed memory size of 134217728 bytes
        // exhausted`), or left out where a title shortens it (`Allowed memory size exhausted`).
        r"|(?i:\bmemory (?:size|limit)(?: of [0-9][0-9,.]*(?: ?[KMGTP]?i?B| bytes)?)? (?:exhausted|exceeded))",
        // Windows' memory error codes: not enough memory (8), out of memory (14), the commit
        // limit (1455: the paging file is too small), whatever language the message is in.
        r"|(?i:\[winerror (?:8|14|1455)\]|\bos error (?:8|14|1455)\b|\berrno[= ]1455\b)",
        // `MemoryError` also ends a library's own exception type (Arrow's `ArrowMemoryError`,
        // numpy's `_ArrayMemoryError`: a capital or an underscore opens the type's name, so a
        // word glued to it, `solveMemoryError`, is not one), and `std::bad_alloc` says `bad allocation` under MSVC's
        // standard library (LightGBM's `LightGBMError: bad allocation` on Windows).
        r"|\b(?:[A-Z_][A-Za-z_]*)?MemoryError\b|\bbad_alloc\b|\bBadAlloc\b|(?i:\bbad allocation\b)",
        r"|(?i:\b(?:insufficient|not enough|no available|no free|low on|ran out of|running out of|run out of|runs out of) (?:\w+ ){0,2}(?:memory|ram|vram)\b)",
        r"|(?i:\b(?:used|using|use) all (?:the )?available (?:memory|ram|vram)\b)",
        // Nothing left for what comes next (SGLang's `Loaded weights leave no GPU memory for the
        // KV cache`).
        r"|(?i:\b(?:leaves?|leaving|left) (?:no|too little|not enough|insufficient) (?:\w+ ){0,2}(?:memory|ram|vram)\b)",
        // An allocator refusing a request's size as invalid (PostgreSQL's `invalid memory alloc
        // request size 1225135280`: past its per-allocation cap).
        r"|(?i:\binvalid (?:memory )?alloc(?:ation)? request size\b)",
        r"|(?i:\bmemory allocation\b[^\n]{0,40}?\bfailed)",
        // An allocation of a stated size that failed (Gaudi's `workspace Allocation of size
        // ::14493741952 failed`), also named by the C allocator's call (Arrow's `realloc of size
        // 2172846080 failed`).
        r"|(?i:\b(?:allocation|(?:m|c|re)?alloc)\b[^\n]{0,40}?\bsize\b[^\n]{0,40}?\bfail(?:ed|s|ure)\b|\ballocation fail(?:ed|s|ure)\b[^\n]{0,40}?\bsize\b)",
        // An allocation of a stated number of bytes that failed, either order (`malloc: failed on
        // request for 72 bytes`, Go's `VirtualAlloc of 1703936 bytes failed with errno=487`).
        r"|(?i:\b(?:m|c|re)?alloc\w*\b[^\n]{0,30}?\bfail(?:ed|s|ure)?\b[^\n]{0,40}?\b[0-9]+ ?bytes\b|alloc\w*\b[^\n]{0,12}?\b[0-9]+ ?bytes\b[^\n]{0,20}?\bfailed\b)",
        // A request larger than the memory there is, however worded (MindSpore's `alloc size :
        // N is more than total mem size : M`), and a size that would pass a memory breaker's limit
        // (`would be [N/1.8gb], which is larger than the limit of [M/1.8gb]`).
        r"|(?i:\b(?:alloc(?:ation)?|request(?:ed)?)[ _]size\b[^\n]{0,60}?\b(?:more|larger|greater|bigger) than (?:the )?(?:total|available|free|max(?:imum)?) (?:\w+ )?mem(?:ory)?\b|\bwould be\b[^\n]{0,60}?\blarger than (?:the )?limit\b|\bcircuit[_ ]?breaking)",
        // An allocator's own limit passed (MLX's `[metal::malloc] Resource limit (499000)
        // exceeded`).
        r"|(?i:\b(?:m|c|re)?alloc\w*\b[^\n]{0,60}?\blimit\b[^\n]{0,30}?\bexceeded\b)",
        // The same words in the languages reporters write in (Chinese, Japanese, Korean,
        // Russian, German, French, Spanish, Portuguese): a message translated, or a system's
        // error string in its locale around English tokens.
        r"|(?i:内存不足|显存不足|内存溢出|无法分配内存|内存分配失败|分配内存失败|記憶體不足|メモリ不足|メモリが不足|메모리 부족|недостаточно памяти|нехватка памяти|не удалось выделить память|nicht genügend (?:arbeits)?speicher|mémoire insuffisante|pas assez de mémoire|memoria insuficiente|memória insuficiente)",
        // Memory that could not grow (Emscripten's `Cannot enlarge memory arrays`).
        r"|(?i:\b(?:cannot|can't|can not|could ?not|couldn't|unable to|failed to) (?:enlarge|grow|expand|extend) (?:the )?(?:\w+ )?(?:memory|heap)\b)",
        r"|(?i:\b(?:greater|larger) than the maximum (?:allowed )?(?:buffer|allocation) size|\bcould not be allocated\b)",
        r"|(?i:\b(?:requires?|required|needs?|needed) more (?:\w+ ){0,2}(?:memory|ram|vram)\b)",
        // More than there is (Kaggle's `Your notebook tried to allocate more memory than is
        // available`), and the words in the other order (Kunlun's and Paddle's `Device memory not
        // enough`).
        r"|(?i:\bmore (?:\w+ ){0,2}(?:memory|ram|vram) than (?:is |was |are )?(?:available|free|allowed)\b|\b(?:memory|ram|vram) (?:is )?not enough\b)",
        // An automatic batch-size search that halved the batch on every out-of-memory error down
        // to nothing (accelerate's and the HF Trainer's `No executable batch size found, reached
        // zero.`).
        r"|(?i:\bno (?:executable |usable |valid |working )?batch size (?:found|fits|that fits)\b)",
        r"|(?i:\bexceeds? (?:the )?(?:available|free|total) (?:\w+ ){0,2}(?:memory|ram|vram)\b)",
        r"|(?i:\b(?:does not|doesn't|won't|will not|cannot|can't|could not|couldn't) fit (?:in|into|on) (?:the )?(?:\w+ ){0,2}(?:memory|ram|vram)\b)",
        r"|(?i:\bexhausted (?:all )?(?:the )?(?:available )?(?:\w+ )?(?:memory|ram|vram)\b|\bmemory (?:is|was|has been) exhausted)",
    )
    // ASCII word boundaries and word characters: the words are ASCII, and Unicode ones keep the
    // lazy DFA from scanning a long log at speed.
    .replace(' ', r"[\s_]")
    .replace(r"\b", r"(?-u:\b)")
    .replace(r"\w", "[0-9A-Za-z_]"))
    // Room for the lazy DFA of a long alternation, so that it is not rebuilt while scanning.
    .dfa_size_limit(64 << 20)
    .build()
    .ok()
});

/// Phrases that make a line advice or documentation about memory rather than a report of it.
const ADVICE: &[&str] = &[
    "if you encounter",
    "if you are",
    "if you're",
    "if it runs out",
    "if you run out",
    "if you get",
    "if you see",
    "to avoid",
    "avoid oom",
    "prevent",
    "in case of",
    "may cause",
    "might cause",
    "could cause",
    "can cause",
    "may run out",
    "might run out",
    "may lead to",
    "errors may",
    "error may",
    "may kill",
    "might kill",
    "can kill",
    "may be killed",
    "could lead to",
    "helps reduce",
    "to reduce",
    "in order to",
    "e.g.",
    "for example",
    "is enabled",
    "enable_",
    "oom_score",
    // A test or a reporter setting out to cause one (`Attempting to force OOM...`), not a report.
    "force oom",
    "forcing oom",
    "force an oom",
    "trigger oom",
    "trigger an oom",
    "simulate oom",
    "simulate an oom",
    "induce oom",
    "induce an oom",
];

/// Words that put a generic finding on a device rather than in host memory.
const DEVICE_WORDS: &[&str] = &[
    "cuda",
    "gpu",
    "vram",
    "hip",
    "xpu",
    "npu",
    "mlu",
    "musa",
    "tpu",
    "device",
    "cudnn",
    "cublas",
    "metal",
    "mps",
    "vulkan",
    "opencl",
    // OpenCL's device-memory statuses (`CL_MEM_OBJECT_ALLOCATION_FAILURE`, `CL_OUT_OF_RESOURCES`).
    "cl_mem_",
    "cl_out_of_resources",
    "directml",
    "dml",
    "hpu",
    "devmem",
    "thrust",
    "video memory",
    "rocm",
    "prefill",
    "kv cache",
    "kv_cache",
    "mem-fraction",
    "gpu_memory_utilization",
    "max_num_seqs",
    "resource_exhausted",
    "xla",
];

/// Words that put a generic finding in host memory even where its lines also name a device
/// (llama.cpp's `ggml_backend_cpu_buffer_type_alloc_buffer` before `failed to allocate buffer for
/// kv cache`).
const HOST_WORDS: &[&str] = &[
    "cpu buffer",
    "cpu_buffer",
    "cpu memory",
    "host memory",
    "system memory",
    "system ram",
    "cpu ram",
    "on host",
    // Windows' commit limit: the paging file backs host memory.
    "paging file",
    "winerror 1455",
    "os error 1455",
    "errno=1455",
];

/// A runtime asking to lower its own settings (vLLM's `Please try lowering max_num_seqs`).
const OWN_SETTINGS: &[&str] = &[
    "try lowering",
    "try reducing",
    "try decreasing",
    "please lower",
    "please reduce",
];

/// Settings that name the OOM killer without reporting a kill (`--oom-kill-disable`).
const SETTINGS: &[&str] = &[
    "oom-kill-disable",
    "oom_kill_disable",
    "oom_kill_allocating_task",
    "panic_on_oom",
    "oom_group",
    "\"oomkilled\": false",
    "oomkilled: false",
];

/// Docker's `OOMKilled` state set to false (lower case), in any quoting and spacing.
static NOT_OOM_KILLED: Pattern =
    LazyLock::new(|| Regex::new(r#"oomkilled"?\s*[:=]\s*false\b"#).ok());

/// Whether a (lower-cased) line is source code or a setting rather than a report: an `except`
/// or `catch` clause, an import or a definition (not a comment: the JVM's `# Native memory
/// allocation … failed` is a report), an OOM-killer setting, or a stack frame.
fn is_code_or_setting(lower: &str) -> bool {
    let t = lower.trim_start();
    [
        "except ", "except(", "catch (", "catch(", "import ", "def ", "class ",
    ]
    .iter()
    .any(|p| t.starts_with(p))
        || SETTINGS.iter().any(|s| lower.contains(s))
        // A kernel or native stack frame (`mem_cgroup_out_of_memory+0xbb/0xd0`) names a function.
        || (lower.contains("+0x") && lower.contains("/0x"))
        // Docker's state says the container was not OOM-killed, however quoted or spaced
        // (`"OOMKilled": false`, `OOMKilled:false,`).
        || NOT_OOM_KILLED.as_ref().is_some_and(|re| re.is_match(lower))
}

/// Whether a (lower-cased) line is systemd's record of a unit starting or stopping (`systemd[1]:
/// Started Early OOM Daemon.`): the unit's description may name memory, but nothing failed.
fn is_unit_lifecycle(lower: &str) -> bool {
    lower.find("systemd[").is_some_and(|i| {
        lower[i..].find("]: ").is_some_and(|j| {
            let rest = &lower[i + j + 3..];
            ["started ", "starting ", "stopped ", "stopping ", "reached "]
                .iter()
                .any(|w| rest.starts_with(w))
        })
    })
}

/// The vocabulary's wording of an allocation that could not be made (`failed to allocate …`,
/// `cannot allocate …`), as matched at the start of a vocabulary hit.
static ALLOC_FAILED: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:cannot|can't|can not|could ?not|couldn't|unable to|failed to|fails? to) (?:[a-z]+ )?(?:(?:re)?allocate|(?:re)?alloc|map|commit|reserve)\b").ok()
});

/// Whether the vocabulary hit `from..to` of `line` is an allocation failure that states another
/// cause than memory: past a colon after it, the line says what went wrong in words that are
/// none of the vocabulary's, not a figure (`failed to allocate pinned system memory: CUDA driver version is
/// insufficient for CUDA runtime version`, `failed to allocate 1900,00 MiB of pinned memory:
/// invalid argument`, `… : no pinned memory pool`). A cause that is memory's (`: out of
/// memory`, `: CUDA_ERROR_OUT_OF_MEMORY`, `: errno=12`) keeps the failure.
fn failed_for_another_cause(line: &str, from: usize, to: usize) -> bool {
    let (Some(alloc), Some(vocabulary)) = (ALLOC_FAILED.as_ref(), VOCABULARY.as_ref()) else {
        return false;
    };
    let (Some(hit), Some(rest)) = (line.get(from..to), line.get(to..)) else {
        return false;
    };
    if !alloc.is_match(hit) {
        return false;
    }
    let Some(colon) = rest.find(": ") else {
        return false;
    };
    // A cause is words (`invalid argument`); a figure after a colon (`total memory: 24 GiB`) is
    // a field of the report, not its cause.
    let cause = rest[colon + 2..].trim();
    cause.starts_with(char::is_alphabetic) && !vocabulary.is_match(cause)
}

/// A condition on someone or something (`if they're running out of memory the nanny will kill
/// them`, `if we run out of RAM`): a case considered, not one reported. Lower case.
static HYPOTHETICAL: Pattern = LazyLock::new(|| Regex::new(r"\bif (?:you|they|we|it|one)\b").ok());
/// A word that denies what follows in its clause (`it's not a problem about OOM`).
static NEGATION: Pattern =
    LazyLock::new(|| Regex::new(r"\b(?:not|isn't|wasn't|aren't|weren't|never|no longer)\b").ok());
/// Words of the clause before a vocabulary hit that may deny it.
const DENIAL_WORDS: usize = 5;

/// Whether the clause that holds the vocabulary hit at `at` of the (lower-cased) line denies it
/// within [`DENIAL_WORDS`] words before it (`I watched GPU memery with nvidia-smi, it's not a
/// problem about OOM.`): the writer says there was no such failure. A negation the vocabulary's
/// own words hold (`not enough memory`, `could not allocate`) is inside the hit, not before it.
fn denied(lower: &str, at: usize) -> bool {
    let before = &lower[..super::scan::floor(lower, at.min(lower.len()))];
    let clause = before
        .rfind(['.', ',', ';', ':', '!', '?', '(', ')', '"', '`'])
        .map_or(before, |i| &before[i + 1..]);
    let words: Vec<&str> = clause.split_whitespace().collect();
    let near = words[words.len().saturating_sub(DENIAL_WORDS)..].join(" ");
    NEGATION.as_ref().is_some_and(|re| re.is_match(&near))
}

/// A failure to lock memory (`mlock`, `mlockall`, earlyoom's `Could not lock memory - continuing
/// anyway: Cannot allocate memory`) before the vocabulary hit at `at` of the (lower-cased) line:
/// the ENOMEM is the locked-memory limit (`RLIMIT_MEMLOCK`), not memory running out.
static LOCKED: Pattern = LazyLock::new(|| {
    Regex::new(r"\b(?:(?:could ?not|cannot|can't|unable to|failed to) (?:m)?lock(?:all)? (?:\w+ )?memory\b|mlock(?:all)?\b)").ok()
});

fn locked_not_allocated(lower: &str, at: usize) -> bool {
    let before = &lower[..super::scan::floor(lower, at.min(lower.len()))];
    LOCKED.as_ref().is_some_and(|re| re.is_match(before))
}

/// A line within this many lines of a specific reader's message belongs to that message.
const NEAR: usize = 6;

/// A size after `allocate`, `commit` or `reserve` (also a few words on: DirectML's `Could not
/// allocate tensor with 234881024 bytes`, GHC's `Unable to commit 1048576 bytes`; Chinese `分配`),
/// `mmap(`, `needed` (MySQL's `Out of memory (Needed 2091016 bytes)`), `request for`, `requested`
/// (also a label: `requestedSpace: 148560384 B`, `requested size: 2 GiB`, PostgreSQL's `the request
/// size (currently 2495567072 bytes)`), `amount of memory (`, …; also as an adjective (Go's `cannot
/// allocate 4194304-byte block`).
static SIZE_AFTER: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)(?:(?:allocat(?:e|ing)|commit|reserve):?(?:\s+[a-z]+){0,3}?|alloc(?:ation)? of|failed to map|mmap\(|\bneed(?:ed|s)?|requested(?:[a-z_ ]{0,16}?(?:[:=]| was\b| is\b))?|request(?:ing)? (?:of|for)|request(?:ed)? size\s*(?:\(\s*(?:currently|of)?|[:=]|of|is|was)|分配|tried to allocate|amount of (?:gpu |device |host )?memory \(|requires? more (?:\w+ ){0,2}memory \()\s*([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(\.[0-9]*)?(?:\s|-)?(bytes|byte|[KMGTP]i?B|B)(?-u:\b)").ok()
});
/// A size after `buffer of size` (llama.cpp's `failed to allocate CPU buffer of size 84940800`,
/// R's `cannot allocate vector of size 4.5 Gb`, PostgreSQL's `Failed on request of size 16`,
/// Gaudi's `Allocation of size ::14493741952`, `Allocation failed for size::234881024`,
/// PostgreSQL's `alloc request size 1225135280`, Triton's `CUDA memory with byte size 78643200`):
/// bytes when no unit follows.
static SIZE_OF: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:(?:buffer|block|array|tensor|chunk|region|allocation|(?:m|c|re)?alloc|vector|request) of|(?:failed|fails|failure) for|alloc(?:ation)? request|byte) size\s*:*\s*([0-9]+)(\.[0-9]+)?\s?(bytes|byte|[KMGTP]i?B|[KMGT]b|B)?\b").ok()
});
/// A size before what it sizes, in parentheses (`alloc failed for tensor-span:105 (1792.00 MiB
/// chunk)`).
static SIZE_NOUN: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\(([0-9]+)(\.[0-9]+)?\s?([KMGTP]i?B) (?:chunk|block|buffer|region|tensor)\)")
        .ok()
});
/// A negative size where a request's size is written (`cannot allocate -8410442019078995968-byte
/// block`).
static NEGATIVE_SIZE: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:allocate|alloc(?:ation)? of|of size|request(?:ed)?)\s*:*\s*-[0-9]").ok()
});
/// The limit a process passed (`memory limit of 134217728 bytes`, `Worker memory limit: 4.29 GB`,
/// PHP's `Allowed memory size of 134217728 bytes exhausted`, a `max: 8 GiB` or `limit=2GB`
/// field, a maximum of a memory measure such as `maxPSS: 16000 MB`, Cloud Run's `Memory limit of
/// 953M`).
static LIMIT: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:(?:memory (?:usage )?limit|allowed memory size)(?: of|:|=| is)?|(?:max(?:imum)?|limit)(?: ?memory| ?pss| ?rss| ?vss)?\s?[:=])\s*([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(\.[0-9]+)?\s?(bytes|byte|[KMGTP]i?B|[KMGT])\b").ok()
});
/// A limit in bytes without a unit, where the number is long enough to be bytes (4 digits or more):
/// a heap's `growth limit 268435456`, a field's `max_memory_limit=33554432`, a counter's `(used:
/// N, max: M)`, a breaker's `limit of [1960417689/1.8gb]`.
static BYTE_LIMIT: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)(?:(?:\b|_)(?:memory|heap|growth)[\s_]limit\s?[:=]?|\bmax(?:imum)?\s?[:=]|\blimit of \[)\s*([0-9]{4,})()()(?:[\s,)\]/;.]|$)").ok()
});
/// The memory a process used when it was killed, as a field (PM2's `current_memory=46522368`, a
/// `memory_used: 2 GiB`): bytes when no unit follows.
static USED: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:current[_ ](?:memory|mem|rss)|mem(?:ory)?[_ ]used|used[_ ]mem(?:ory)?)\s?[:=]\s*([0-9]+)(\.[0-9]+)?\s?(bytes|[KMGTP]i?B)?\b").ok()
});
/// The current value of a memory-size setting the message names as the one to raise (Emscripten's
/// `compile with -s TOTAL_MEMORY=X with X higher than the current value 67108864`; any setting
/// whose name joins memory or heap with an underscore, and `current value|limit|size`,
/// `currently`): bytes when no unit follows.
static SETTING_LIMIT: Pattern = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b\w*(?:_(?:MEMORY|MEM|HEAP)|(?:MEMORY|MEM|HEAP)_)\w*\b[^\n]{0,80}?\b(?:current(?: (?:value|limit|size|setting))?(?: is| of)?|currently(?: set to)?)[:=]?\s*([0-9]+)(\.[0-9]+)?\s?([KMGTP]i?B|bytes)?\b",
    )
    .ok()
});
static SHAPE: Pattern = LazyLock::new(|| {
    Regex::new(r"with shape \(([0-9,\s]+)\)(?: and data type ([<>|=]?[A-Za-z0-9_]+))?").ok()
});
/// An error code the message states: `[Errno 12]`, `errno=12`, `Error code 12`, Windows' codes,
/// `error: (-5)`, and a field named `code` (`Vulkan Error, code=-2`, an error object's `ERROR',
/// code: '53200'`, `{code: 12`): after the error's name or a separator, so `exit code: 1` is not
/// one; a database's numbered error (MySQL's `Memory allocation error: 1038 Out of sort memory`,
/// `ERROR 1038 (HY001): Out of …`); and a status token's code in parentheses after it
/// (`CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)`), Java's `CreateProcess error=1455`, or before it after the word that returns it (Level
/// Zero's `Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)`, `backend failed with
/// error: 39 (…)`), and a failed call's code in parentheses after a comma (Kunlun's `ioctl() fail,
/// (705) Device memory not enough`).
static ERRNO: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\[errno ([0-9]+)\]|errno[= ]([0-9]+)\b|error code (-?[0-9]+)\b|\[winerror ([0-9]+)\]|\bos error ([0-9]+)\b|\berror: \((-?[0-9]+)(?::[^)\n]{0,40})?\)|(?:\berror\W{1,3}|[,;{(:]\s*|^\s*)code\s?[=:]\s?'?(-?[0-9]+)\b|\berror:?\s([0-9]{3,5})(?:\s\([0-9A-Z]{5}\))?:?\s(?-i:[A-Z][a-z])|(?-i:\b[A-Z][A-Z0-9]*_[A-Z0-9_]{3,}) \((-?[0-9]+)\)|\b(?:error|returns?|status)\W{1,3}(-?[0-9]+) \((?-i:[A-Z][A-Z0-9]*_[A-Z0-9_]{3,})\)|\bfail(?:ed|ure)?, \((-?[0-9]+)\)|\berror=([0-9]+)\b").ok()
});
/// A device's index: after `device` (`on device 0`, `device ordinal 1`, `device_id=2`), after an
/// accelerator's name with or without a colon (`GPU 0`, `XPU:0`, `HPU 1`), and after any device
/// word with a colon (`cuda:1`, `dml:0`, `mps:0`). The index ends where a word or a version would
/// go on (`CUDA 11.8` is no device), though text in another script may follow at once (`GPU 0上`).
static DEVICE: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:on device(?: ordinal)?|device ordinal|device(?:_id|_index)?[=: ]|[abd-z]pu[ #:]?|(?:cuda|hip|dml|directml|mps|metal|vulkan|opencl|xla|mlu|musa|rocm|level_zero):)\s?([0-9]+)(?:$|[^0-9A-Za-z_.]|\.(?:$|[^0-9]))")
        .ok()
});
/// A process id the text states; group 1 is the `[` of a logger's tag (`[PID: 210907]`, a field
/// of the log line's header), whose pid is the logger's, not the message's.
static PID: Pattern = LazyLock::new(|| Regex::new(r"(?i)(\[\s*)?\bpid[ =:(]\s?([0-9]+)\b").ok());
/// A size or a device written as a `key:value` pair (Ascend's `Call rtMalloc fail, purpose: page
/// caching, type = 2, size:3221291008, device_id:0`): the key opens the line or follows a
/// separator, so `batch size: 8` is not one, or it names the allocation (`alloc size : N`, a
/// breaker's `new bytes reserved: [N/…]`). A size without a unit is in bytes.
static KEY_SIZE: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)(?:(?:^|[,;(\[{]\s*)(?:size|bytes|alloc_size|request_size)|\b(?:alloc(?:ation)?|request(?:ed)?) size|\bbytes (?:reserved|wanted|requested))\s?[:=]\s?\[?([0-9]+)(\.[0-9]+)?\s?(bytes|[KMGTP]i?B|B)?\b").ok()
});
static KEY_DEVICE: Pattern = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:^|[,;(\[{]\s*)(?:device|device_id|device_index|dev_id|devid)\s?[:=]\s?([0-9]+)\b",
    )
    .ok()
});
/// The memory the message says was free (`0 bytes free`, `There are 1.92G free`, `free memory:
/// 2 GiB`, `of which 20 MiB is free`, `available: 3 GB`): it notes what the verdict may use, not a
/// fact.
static FREE: [Pattern; 2] = [
    LazyLock::new(|| {
        Regex::new(r"(?i)(?:\b(?:free|available)(?: memory)?\s?[:=]\s?|\bof which )([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(\.[0-9]+)?\s?([KMGTP]i?B|bytes|B)\b").ok()
    }),
    LazyLock::new(|| {
        Regex::new(r"(?i)\b([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(\.[0-9]+)?\s?([KMGTP]i?B|bytes|B) (?:is |are )?(?:free|available)\b").ok()
    }),
];
/// The memory the message says the device or machine has in all (`total capacity of 24 GiB`,
/// `Total memory: 16 GB`, `16 GiB total`).
static TOTAL: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\btotal(?: memory| capacity| size)?(?: of)?\s?[:=]?\s?([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(\.[0-9]+)?\s?([KMGTP]i?B|bytes|B)\b").ok()
});
/// An allocator's own limit passed (MLX's `[metal::malloc] Resource limit (499000) exceeded`);
/// group 1 names what the limit counts.
static ALLOCATOR_LIMIT: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:m|c|re)?alloc\w*\b[^\n]{0,60}?\b(\w+) limit\b[^\n]{0,30}?\bexceeded\b")
        .ok()
});
/// A cap on one operation rather than on memory: a memory limit that belongs to a query, a stage or
/// a sort (ClickHouse's `Memory limit (for query) exceeded`, MongoDB's `Exceeded memory limit for
/// $group`, `Sort exceeded memory limit`, MySQL's `Out of sort memory`), or a size past what an
/// array or object may have (.NET's `Array dimensions exceeded supported range`).
static OPERATION_CAP: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\bmemory limit\s*\(?for\s+[$\w]+|\b(?:sort|query|aggregation|stage)\b[^\n]{0,20}?\bexceeded (?:the )?memory limit|\bout of (?:sort|query|join) memory\b|\b(?:array|object|buffer) (?:dimensions|size) exceeded (?:the )?(?:supported|maximum|allowed)").ok()
});
/// Most lines read after a vocabulary line for the facts of the message it opens.
const CONTINUED: usize = 8;
/// A process killed for memory (`OOMKilled`, `OOM killer`, `oom-kill`, `killed by out of memory`,
/// `killed due to memory usage`), whoever reports it, with the exit code it states.
/// Also a memory monitor's kill: systemd-oomd's, or a worker restarted because it passed its
/// memory limit or budget (Dask's nanny: `exceeded 95% memory budget. Restarting`; PM2's `Process 2
/// restarted because it exceeds --max-memory-restart value`).
static KILLED: Pattern = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)\boom[-_ ]?kill|\bkilled (?:by|due to|because of) (?:the |an? )?(?:oom\b|out[ -]of[ -]memory|memory usage)|\bsystemd-oomd killed|\bsystemd-oomd\[[0-9]+\]: (?:Killed /|oomd attempting to kill [0-9]+)|\bdue to memory pressure\b",
        r"|\bmemory (?:usage )?(?:limit|budget|threshold)\W[^\n]{0,40}?\b(?:restarting|killing|terminating)\b",
        r"|\b(?:restarted|killed|terminated) because it exceed(?:s|ed)\b",
    ))
    .ok()
});
/// An automatic batch-size search that gave up (accelerate's `No executable batch size found`): it
/// retries on an accelerator's out-of-memory errors, so the failure is the device's, its size
/// unknown.
static BATCH_SEARCH: Pattern = LazyLock::new(|| {
    Regex::new(
        r"(?i)\bno (?:executable |usable |valid |working )?batch size (?:found|fits|that fits)\b",
    )
    .ok()
});
/// A program that caught the failure and goes on with a smaller batch (the Dreambooth trainer's
/// `OOM Detected, reducing batch/grad size to 12/1.`) or another way (Fooocus' `Ran out of memory
/// when regular VAE decoding, retrying with tiled VAE decoding.`, Triton's `Failed to allocate CUDA
/// memory … falling back to pinned system memory`): it recovered, unless the line only advises
/// doing so (`try reducing the batch size to 8`).
static RETRYING: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:reducing|lowering|halving|decreasing|retrying with)\b[^\n]{0,30}?\bbatch(?:[/_-]?[a-z]+)?[ _]size\b[^\n]{0,20}?\bto [0-9]|\b(?:falling|falls?) back to\b|\bretrying with\b").ok()
});
/// Words that make [`RETRYING`] advice to the reader rather than what the program did.
const SUGGESTING: [&str; 6] = ["try", "please", "consider", "should", "you ", "suggest"];
/// Exit code 137 (SIGKILL) named as such: `exit code 137`, `exited with status 137`, `Status code
/// 137` (a CI task's words).
static EXIT_137: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:exit(?:ed)?(?: with)? (?:code|status)|status code)[ :=]*137\b").ok()
});
/// An exit code a kill report states (`exit_code=-9`, `exit code 0`, `Exit status: 9`).
static STATED_EXIT: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\bexit(?:ed)?[ _]?(?:with )?(?:code|status)\b[ :=]{0,3}(-?[0-9]+)\b").ok()
});

/// A line's byte range and its number (0-based).
struct Line {
    start: usize,
    end: usize,
    number: usize,
}

/// Generic pieces for the vocabulary lines of `text` that no piece in `specific` explains.
pub(crate) fn find(text: &str, specific: &[Piece], out: &mut Vec<Piece>) {
    let Some(re) = VOCABULARY.as_ref() else {
        return;
    };
    // Line numbers of every specific message's first and last line, ascending by start.
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(specific.len());
    let mut hits: Vec<Line> = Vec::new();
    let mut counted = 0usize;
    let mut line = 0usize;
    let mut number_at = |at: usize| {
        line += text.as_bytes()[counted..at]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        counted = at;
        line
    };
    // Both lists ascend, so one walk through the text numbers every offset.
    // A message's evidence, or the first line of a kernel report (its lines follow).
    let mut starts: Vec<(usize, usize, bool)> = specific
        .iter()
        .filter(|p| p.evidence || (p.opens && p.kind == Kind::LinuxOomKiller))
        .map(|p| (p.start, p.end, true))
        .collect();
    for m in re.find_iter(text) {
        starts.push((m.start(), m.end(), false));
    }
    starts.sort_by_key(|&(s, _, _)| s);
    let mut last_hit_line = usize::MAX;
    for (s, e, is_specific) in starts {
        let first = number_at(s);
        if is_specific {
            let e = e.max(s).min(text.len());
            let extra = text.as_bytes()[s..e]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            spans.push((first, first + extra));
            continue;
        }
        if first == last_hit_line {
            continue;
        }
        last_hit_line = first;
        let start = text[..s].rfind('\n').map_or(0, |i| i + 1);
        let end = super::scan::line_end(text, s);
        let lower = text[start..end].to_ascii_lowercase();
        // Advice counts where it frames the report: before it, or in its own sentence after it
        // (`… memory arrays. Either (1) compile with …, which prevents some optimizations` is
        // the runtime's advice after its report, not advice about memory in general).
        let framed = &lower[..sentence_end(&lower, e.min(end).saturating_sub(start))];
        if ADVICE.iter().any(|a| framed.contains(a))
            || is_code_or_setting(&lower)
            || is_unit_lifecycle(&lower)
            || HYPOTHETICAL.as_ref().is_some_and(|re| re.is_match(framed))
            || denied(&lower, s - start)
            || locked_not_allocated(&lower, s - start)
            || failed_for_another_cause(&text[start..end], s - start, e.min(end) - start)
        {
            continue;
        }
        hits.push(Line {
            start,
            end,
            number: first,
        });
    }
    spans.sort_unstable();
    // Drop hits near a specific message (two pointers over ascending lists).
    let mut j = 0;
    for h in hits {
        while j < spans.len() && spans[j].1 + NEAR < h.number {
            j += 1;
        }
        let near = spans[j..]
            .iter()
            .take_while(|s| s.0 <= h.number + NEAR)
            .any(|s| s.1 + NEAR >= h.number);
        if near {
            continue;
        }
        let l = &text[h.start..h.end];
        // A userspace OOM killer's low-memory state is a failure where its kill follows.
        if LOW_MEMORY.as_ref().is_some_and(|re| re.is_match(l)) {
            if let Some((to, facts)) = monitor_kill_after(text, h.end) {
                out.push(Piece::part(h.start, to, Kind::OomKillReport, facts, true));
            }
            continue;
        }
        let (kind, mut facts) = attribute(l);
        let mut end = h.end;
        // A message that goes on in indented lines (`CudaCustomAllocator out of memory` then
        // ` [requestedSpace: 148560384 B]`; Ascend's graph engine, whose traceback lines carry
        // the logger's header before their indent) states its size and device there.
        if kind == Kind::GenericOom {
            end = continued(text, h.start, h.end, &mut facts);
        }
        // A memory monitor names the process it killed on the next line (Dask's nanny:
        // `exceeded 95% memory budget. Restarting` then `Worker process 22204 was killed by …`).
        if kind == Kind::OomKillReport && facts.get("pid").is_none() {
            if let Some((to, pid)) = killed_pid_after(text, h.end) {
                facts.int("pid", pid);
                end = to;
            }
        }
        let mut p = Piece::part(h.start, end, kind, facts, true);
        // A line that is only the vocabulary's words (`out of memory` under ggml's `command
        // buffer 6 failed with status 5`) ends the line before it: its words are the message's.
        let said = match bare_after(text, h.start, l) {
            Some(before) => format!("{before}\n{l}"),
            None => l.to_string(),
        };
        let said = said.as_str();
        let told = &text[h.start..end];
        let lower = said.to_ascii_lowercase();
        p.notes.device = DEVICE_WORDS.iter().any(|w| has_word(said, &lower, w))
            || p.facts.get("device_index").is_some()
            || BATCH_SEARCH.as_ref().is_some_and(|re| re.is_match(l));
        p.notes.negative_size = NEGATIVE_SIZE.as_ref().is_some_and(|re| re.is_match(l));
        p.notes.non_fatal = RETRYING.as_ref().is_some_and(|re| {
            re.find(l).is_some_and(|m| {
                let before = l[..m.start()].to_ascii_lowercase();
                !SUGGESTING.iter().any(|w| before.contains(w))
            })
        });
        p.notes.host_words = HOST_WORDS.iter().any(|w| lower.contains(w));
        p.notes.free_bytes = FREE.iter().find_map(|re| first_size(re, told));
        p.notes.total_bytes = first_size(&TOTAL, told);
        p.notes.allocator_limit = ALLOCATOR_LIMIT
            .as_ref()
            .and_then(|re| re.captures(l))
            .and_then(|c| c.get(1))
            .is_some_and(|w| {
                !matches!(
                    w.as_str().to_ascii_lowercase().as_str(),
                    "memory" | "mem" | "ram" | "heap" | "size"
                )
            })
            || OPERATION_CAP.as_ref().is_some_and(|re| re.is_match(l));
        // The advice may be wrapped onto the next lines.
        let mut after = h.end;
        for _ in 0..2 {
            if after < text.len() {
                after = super::scan::line_end(text, after + 1);
            }
        }
        let following = text[h.end..after].to_ascii_lowercase();
        p.notes.own_settings = OWN_SETTINGS
            .iter()
            .any(|w| lower.contains(w) || following.contains(w));
        out.push(p);
    }
}

/// The line before the vocabulary line at `start` when `line` holds little but the vocabulary's
/// words (at most one other word: `out of memory`, wgpu's `Not enough memory left.` under `In
/// Device::create_buffer`): the message it ends.
fn bare_after<'a>(text: &'a str, start: usize, line: &str) -> Option<&'a str> {
    let m = VOCABULARY.as_ref()?.find(line)?;
    let words = |t: &str| {
        t.split(|c: char| !c.is_alphabetic())
            .filter(|w| !w.is_empty())
            .count()
    };
    if words(&line[..m.start()]) + words(&line[m.end()..]) > 1 {
        return None;
    }
    let before = text[..start].trim_end_matches(['\n', '\r']);
    let from = before.rfind('\n').map_or(0, |i| i + 1);
    Some(&before[from..]).filter(|b| !b.trim().is_empty())
}

/// Bytes of the first size `re` finds in `text` (number, fraction, unit as in [`size_of`]).
fn first_size(re: &Pattern, text: &str) -> Option<i128> {
    re.as_ref()?.captures(text).and_then(|c| size_of(&c))
}

/// Where the sentence that holds offset `at` of `line` ends: after the next `. `, `! `, `? ` or
/// `; ` (MySQL's `(errno 12); if you are not out of available memory, …` is advice after the
/// report), else at the line's end.
fn sentence_end(line: &str, at: usize) -> usize {
    let at = super::scan::floor(line, at.min(line.len()));
    [". ", "! ", "? ", "; "]
        .iter()
        .filter_map(|p| line[at..].find(p))
        .min()
        .map_or(line.len(), |i| at + i + 1)
}

/// Whether `lower` (the lower-case copy of `line`) holds `word` where a word starts (not inside
/// another: `tpu` in `input`, `mps` in `jumps`); it may run on into an identifier (`hipMalloc`,
/// `cuda_error`).
fn has_word(line: &str, lower: &str, word: &str) -> bool {
    lower.match_indices(word).any(|(i, _)| {
        lower[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_ascii_alphanumeric())
            // A capital starts a word inside an identifier (`kIOGPUCommandBuffer…`).
            || line[i..].starts_with(|c: char| c.is_ascii_uppercase())
    })
}

/// Reads the facts the vocabulary line `start..end` lacks from the lines that continue its
/// message, and returns where the last line read from ends (`end` when none gave a fact).
///
/// A line continues the message when it is indented, also after the logger's header it shares
/// with the vocabulary line (`ERROR 04-09 21:56:46 [engine.py:82]         Call rtMalloc fail …`),
/// while a bracket or quote it opened is still open, when the line right after it opens with a
/// label (`DETAIL:`, `HINT:`, in any language), or when it opens with a parenthesized clause
/// (PHP's `… bytes exhausted⏎(tried to allocate 20480 bytes) in …`, wrapped; only the clause is
/// read, so a logger's `(Worker pid=N)` prefix states nothing). The first size, device and limit
/// stated are the message's.
fn continued(text: &str, start: usize, end: usize, facts: &mut Facts) -> usize {
    let hit = &text[start..end];
    let mut last = end;
    let mut at = end;
    let mut open = Open::default();
    open.read(hit);
    for i in 0..CONTINUED {
        let from = at + 1;
        if from >= text.len() {
            break;
        }
        let to = super::scan::line_end(text, from);
        let whole = &text[from..to];
        at = to;
        let line = if whole.starts_with([' ', '\t']) || open.is_open() {
            whole
        } else if i == 0 && whole.starts_with('(') {
            match whole.find(')') {
                Some(close) => &whole[..close],
                None => break,
            }
        } else if i == 0 && labelled(whole) {
            whole
        } else {
            match shared_header(hit, whole) {
                Some(rest) if rest.starts_with([' ', '\t']) || (i == 0 && labelled(rest)) => rest,
                _ => break,
            }
        };
        open.read(whole);
        let before = facts.len();
        if facts.get("requested_bytes").is_none() {
            let size = [&SIZE_AFTER, &SIZE_OF, &KEY_SIZE]
                .iter()
                .find_map(|re| re.as_ref()?.captures(line).and_then(|c| size_of(&c)));
            facts.opt_int("requested_bytes", size);
        }
        if facts.get("device_index").is_none() {
            let device = [&DEVICE, &KEY_DEVICE].iter().find_map(|re| {
                re.as_ref()?
                    .captures(line)
                    .and_then(|c| c.get(1)?.as_str().parse::<i128>().ok())
            });
            facts.opt_int("device_index", device);
        }
        if facts.get("memory_limit_bytes").is_none() {
            let limit = [&LIMIT, &BYTE_LIMIT, &SETTING_LIMIT]
                .iter()
                .find_map(|re| re.as_ref()?.captures(line).and_then(|c| size_of(&c)));
            facts.opt_int("memory_limit_bytes", limit);
        }
        if facts.get("error_code").is_none() {
            let code = ERRNO
                .as_ref()
                .and_then(|re| re.captures(line))
                .and_then(|c| {
                    (1..=12)
                        .find_map(|i| c.get(i))
                        .and_then(|m| m.as_str().parse::<i128>().ok())
                });
            facts.opt_int("error_code", code);
        }
        if facts.len() > before {
            last = to;
        }
        if whole.starts_with('(') {
            break;
        }
    }
    last
}

/// Brackets and double quotes a message has opened and not yet closed: while any is open, its
/// next lines go on with it (Emscripten's `abort("Cannot enlarge memory arrays.` wrapped over
/// four lines before its `").`).
#[derive(Default)]
struct Open {
    parens: i64,
    quotes: usize,
}

impl Open {
    fn read(&mut self, line: &str) {
        for c in line.chars() {
            match c {
                '(' => self.parens += 1,
                ')' => self.parens -= 1,
                '"' => self.quotes += 1,
                _ => {}
            }
        }
    }

    fn is_open(&self) -> bool {
        self.parens > 0 || self.quotes % 2 == 1
    }
}

/// Whether `line` opens with a label, up to three words in any script and a colon (PostgreSQL's
/// `DETAIL:`, `HINT:`, the same in a locale's language, `Подробности:`, Unity's `Trying to
/// allocate: 67108864B`): a line that goes on with the message before it.
fn labelled(line: &str) -> bool {
    let Some(colon) = line.find(':') else {
        return false;
    };
    let label = &line[..colon];
    (1..=24).contains(&label.chars().count())
        && label.split(' ').count() <= 3
        && label
            .split(' ')
            .all(|w| !w.is_empty() && w.chars().all(char::is_alphabetic))
        && line[colon + 1..].starts_with([' ', '\t'])
}

/// What follows the logger's header that `line` shares with `hit`: their common beginning, cut
/// back to just after a blank; `None` when they share none.
fn shared_header<'a>(hit: &str, line: &'a str) -> Option<&'a str> {
    let common = hit
        .bytes()
        .zip(line.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let cut = line.as_bytes()[..common]
        .iter()
        .rposition(|&b| b == b' ' || b == b'\t')?;
    line.get(cut + 1..).filter(|_| cut > 0)
}

/// A process the next line says was killed (`Worker process 22204 was killed by unknown signal`):
/// its pid and that line's end.
static KILLED_PROCESS: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\bprocess \(?(?:pid[= ]?)?([0-9]+)\)? (?:was |has been )?killed\b").ok()
});

/// The pid of the process the line after `end` says was killed, with that line's end.
fn killed_pid_after(text: &str, end: usize) -> Option<(usize, i128)> {
    let start = end + 1;
    if start >= text.len() {
        return None;
    }
    let to = super::scan::line_end(text, start);
    let c = KILLED_PROCESS.as_ref()?.captures(&text[start..to])?;
    Some((to, c.get(1)?.as_str().parse().ok()?))
}

/// A userspace OOM killer's low-memory state (earlyoom's `low memory! at or below SIGTERM limits:
/// mem 10 %`, its older `Low Memory! At or below sigterm limits`).
static LOW_MEMORY: Pattern =
    LazyLock::new(|| Regex::new(r"(?i)\blow (?:on )?memory\W{0,3}\s(?:at or )?below\b").ok());
/// The kill a memory monitor then sends (`sending SIGTERM to process 397 uid 61876 "earlyoom"`,
/// `killing process 28367 "python3" with signal 15`, `Killing process 'bash' with signal 15, pid:
/// 5874`): the process it names, by number or by a `pid:` field.
static MONITOR_KILL: Pattern = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:sending\s+sig[a-z0-9]+\s+to|killing|terminating|signall?ing)\s+process(?:\s+([0-9]+)\b|[^\n]*?\bpid:?\s*([0-9]+)\b)").ok()
});
/// The resident memory of the process a monitor kills (`VmRSS 11793 MiB`, `VmRSS: 3160 MiB`).
static VMRSS: Pattern =
    LazyLock::new(|| Regex::new(r"(?i)\bvmrss:?\s*([0-9]+)(\.[0-9]+)?\s?([KMGTP]i?B|kB)\b").ok());
/// Lines read after a memory monitor's low-memory state for the kill it leads to (earlyoom may
/// print its memory status between them).
const MONITOR_LINES: usize = 2;

/// The kill a memory monitor reports within [`MONITOR_LINES`] lines after `end` (its low-memory
/// line's end): the killed process's pid and resident memory, with the kill line's end.
fn monitor_kill_after(text: &str, end: usize) -> Option<(usize, Facts)> {
    let re = MONITOR_KILL.as_ref()?;
    let mut at = end;
    for _ in 0..MONITOR_LINES {
        let from = at + 1;
        if from >= text.len() {
            return None;
        }
        let to = super::scan::line_end(text, from);
        at = to;
        let line = &text[from..to];
        let Some(c) = re.captures(line) else {
            continue;
        };
        let mut f = Facts::default();
        f.opt_int(
            "pid",
            c.get(1)
                .or_else(|| c.get(2))
                .and_then(|m| m.as_str().parse().ok()),
        );
        f.opt_int(
            "process_memory_bytes",
            VMRSS
                .as_ref()
                .and_then(|re| re.captures(line))
                .and_then(|c| size_of(&c)),
        );
        return Some((to, f));
    }
    None
}

/// `line` without the logger's prefixes: parenthesized or bracketed groups before the text.
fn strip_log_prefix(line: &str) -> &str {
    let mut rest = line.trim_start();
    loop {
        let close = match rest.as_bytes().first() {
            Some(b'(') => ')',
            Some(b'[') => ']',
            _ => return rest,
        };
        match rest.find(close) {
            Some(i) if i < 80 => rest = rest[i + 1..].trim_start_matches([':', ' ']),
            _ => return rest,
        }
    }
}

/// What a vocabulary line states: sizes, shape, error code, device, process, exit code.
fn attribute(line: &str) -> (Kind, Facts) {
    let mut f = Facts::default();
    // A leading `(Worker rank=1 pid=2978)` or `[rank0]:` names the process that logged the line,
    // not one the message reports on.
    let line = strip_log_prefix(line);
    let cap = |re: &Pattern| re.as_ref().and_then(|re| re.captures(line));
    if cap(&EXIT_137).is_some() {
        f.int("exit_code", 137);
        return (Kind::OomKillReport, f);
    }
    if cap(&KILLED).is_some() {
        // `OOMKilled` is Kubernetes' own word for a container's end (its termination reason), in
        // a report or in prose; `docker inspect` writes it as a JSON key instead.
        if line
            .match_indices("OOMKilled")
            .any(|(i, w)| !line[i + w.len()..].starts_with('"'))
        {
            f.text("reporter", "kubernetes");
            f.text("reason", "OOMKilled");
        }
        f.opt_int("pid", stated_pid(line));
        f.opt_int(
            "exit_code",
            cap(&STATED_EXIT).and_then(|c| c.get(1)?.as_str().parse().ok()),
        );
        // A monitor's kill may state the use and the limit it compared (PM2's `current_memory=N
        // max_memory_limit=M`).
        let size = |re: &Pattern| re.as_ref()?.captures(line).and_then(|c| size_of(&c));
        f.opt_int("memory_used_bytes", size(&USED));
        f.opt_int(
            "memory_limit_bytes",
            size(&LIMIT).or_else(|| size(&BYTE_LIMIT)),
        );
        return (Kind::OomKillReport, f);
    }
    if let Some(b) = cap(&SIZE_AFTER)
        .or_else(|| cap(&SIZE_OF))
        .or_else(|| cap(&SIZE_NOUN))
        .or_else(|| cap(&KEY_SIZE))
        .and_then(|c| size_of(&c))
    {
        f.int("requested_bytes", b);
    }
    f.opt_int(
        "memory_limit_bytes",
        cap(&LIMIT)
            .or_else(|| cap(&BYTE_LIMIT))
            .or_else(|| cap(&SETTING_LIMIT))
            .and_then(|c| size_of(&c)),
    );
    if let Some(c) = cap(&SHAPE) {
        let dims: Vec<i128> = c
            .get(1)
            .map_or("", |m| m.as_str())
            .split(',')
            .filter_map(|d| d.trim().parse().ok())
            .collect();
        f.set("shape", Fact::Ints(dims));
        f.opt_text("dtype", c.get(2).map(|m| m.as_str()));
    }
    if let Some(c) = cap(&ERRNO) {
        let code = (1..=12)
            .find_map(|i| c.get(i))
            .and_then(|m| m.as_str().parse::<i128>().ok());
        f.opt_int("error_code", code);
    }
    if let Some(c) = cap(&DEVICE).or_else(|| cap(&KEY_DEVICE)) {
        f.opt_int(
            "device_index",
            c.get(1).and_then(|m| m.as_str().parse().ok()),
        );
    }
    f.opt_int("pid", stated_pid(line));
    (Kind::GenericOom, f)
}

/// The first process id `line` states that is not a logger's `[PID: N]` tag.
fn stated_pid(line: &str) -> Option<i128> {
    PID.as_ref()?
        .captures_iter(line)
        .find(|c| c.get(1).is_none())
        .and_then(|c| c.get(2)?.as_str().parse().ok())
}

/// Bytes of a size captured as number (group 1, thousands separated or not), fraction (group 2)
/// and unit (group 3; bytes when absent).
fn size_of(c: &regex::Captures) -> Option<i128> {
    let int: String = c
        .get(1)
        .map_or("", |m| m.as_str())
        .chars()
        .filter(|c| *c != ',')
        .collect();
    let frac = c.get(2).map_or("", |m| m.as_str());
    let number = format!("{int}{}", if frac == "." { "" } else { frac });
    let unit = c.get(3).map_or("B", |m| m.as_str());
    exact_bytes(&number, unit).and_then(|b| i128::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::facts::Fact;
    use crate::diagnose::Kind;

    fn hits(text: &str) -> usize {
        let mut out = Vec::new();
        find(text, &[], &mut out);
        out.len()
    }

    #[test]
    fn every_pattern_compiles() {
        for p in [
            &VOCABULARY,
            &SIZE_AFTER,
            &SIZE_OF,
            &SIZE_NOUN,
            &NEGATIVE_SIZE,
            &LIMIT,
            &BYTE_LIMIT,
            &USED,
            &SETTING_LIMIT,
            &SHAPE,
            &ERRNO,
            &DEVICE,
            &PID,
            &KEY_SIZE,
            &KEY_DEVICE,
            &FREE[0],
            &FREE[1],
            &TOTAL,
            &ALLOCATOR_LIMIT,
            &OPERATION_CAP,
            &KILLED,
            &EXIT_137,
            &STATED_EXIT,
            &KILLED_PROCESS,
            &ALLOC_FAILED,
            &NOT_OOM_KILLED,
            &HYPOTHETICAL,
            &NEGATION,
            &LOCKED,
            &LOW_MEMORY,
            &MONITOR_KILL,
            &VMRSS,
        ] {
            assert!(p.is_some());
        }
    }

    #[test]
    fn the_vocabulary_compiles_and_finds_every_wording() {
        assert!(VOCABULARY.is_some());
        for line in [
            "OSError: [Errno 12] Cannot allocate memory",
            "MemoryError: Unable to allocate 201. GiB for an array with shape (2999, 2999) and data type int64",
            "java.lang.OutOfMemoryError: Java heap space",
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "the node ran out of memory",
            "Exit code 137 - Out of memory",
            "clCreateBuffer: CL_MEM_OBJECT_ALLOCATION_FAILURE",
            "vkAllocateMemory failed: VK_ERROR_OUT_OF_DEVICE_MEMORY",
            "pod was OOMKilled",
            "Error: model requires more system memory (164.8 GiB) than is available (13.4 GiB)",
            "the model does not fit into GPU memory",
        ] {
            assert_eq!(hits(line), 1, "{line}");
        }
    }

    #[test]
    fn advice_and_ordinary_words_are_not_failures() {
        for line in [
            "If you encounter CUDA out of memory, try to set --tile with a smaller number.",
            "pin_memory=True, memory_efficient_attention enabled, max_memory_allocated=1.2GB",
            "    except torch.cuda.OutOfMemoryError:",
            "docker run --oom-kill-disable --memory 8g trainer",
            "Set PYTORCH_CUDA_ALLOC_CONF to avoid OOM",
            "zoom room bloom",
            "allocated 2.00 GiB on device 0",
        ] {
            assert_eq!(hits(line), 0, "{line}");
        }
    }

    #[test]
    fn attributes_sizes_shapes_codes() {
        let (_, f) = attribute(
            "MemoryError: Unable to allocate 1,234 bytes for an array with shape (2, 3) and data type uint8 [Errno 12]",
        );
        assert_eq!(f.bytes("requested_bytes"), Some(1234));
        assert_eq!(f.get("shape"), Some(&Fact::Ints(vec![2, 3])));
        assert_eq!(f.str("dtype"), Some("uint8"));
        assert_eq!(f.bytes("error_code"), Some(12));
        // A buffer's size without a unit is in bytes.
        let (_, f) =
            attribute("ggml_gallocr_reserve_n: failed to allocate CPU buffer of size 84940800");
        assert_eq!(f.bytes("requested_bytes"), Some(84_940_800));
        let (k, f) = attribute("Worker stopped due to memory limit of 134217728 bytes exceeded");
        assert_eq!(k, Kind::GenericOom);
        assert_eq!(f.bytes("memory_limit_bytes"), Some(134_217_728));
    }

    #[test]
    fn a_memory_monitor_that_kills_or_restarts_is_a_kill_report() {
        for line in [
            "distributed.nanny.memory - WARNING - Worker tls://10.0.0.1:34937 (pid=129) exceeded 95% memory budget. Restarting...",
            "systemd-oomd[840]: Killed /user.slice/app.scope due to memory pressure for /user.slice being 51.07% > 50.00% for > 20s with reclaim activity",
            "vte-spawn.scope: systemd-oomd killed 12 process(es) in this unit.",
        ] {
            assert_eq!(hits(line), 1, "{line}");
            assert_eq!(attribute(line).0, Kind::OomKillReport, "{line}");
        }
        // A warning before the limit is no failure.
        assert_eq!(hits("Worker is at 85% memory usage. Pausing worker.  Process memory: 3.69 GB -- Worker memory limit: 4.29 GB"), 0);
    }
}
