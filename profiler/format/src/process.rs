//! A measured process's place in its job: what it says of itself (parent, rank from the launcher's
//! environment, whether it is a fork that did not exec), the role the sidecar gives it in the job's
//! tree, and the rows the job report keeps per process and per rank.
//!
//! Ranks come from the environment every distributed launcher sets for its ranks, never from a
//! program's name: `RANK` (`torchrun`/`torch.distributed.run`, `accelerate launch`, `deepspeed`),
//! Open MPI's and PMI's rank variables (`mpirun`, `srun --mpi`), and Slurm's `SLURM_PROCID` (`srun`).

use serde::{Deserialize, Serialize};

/// Where a process's rank came from: the more specific source wins in a job that has several (a
/// `torchrun` started by `srun` carries `SLURM_PROCID`, its ranks `RANK` too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankSource {
    /// `SLURM_PROCID` (with `SLURM_LOCALID`, `SLURM_NTASKS`).
    Slurm,
    /// `OMPI_COMM_WORLD_RANK` or `PMI_RANK` (MPI launchers).
    Mpi,
    /// `RANK` (with `LOCAL_RANK`, `WORLD_SIZE`): PyTorch's launchers and those built on them.
    Torch,
}

/// Whether a command line is a child Python's `multiprocessing` started with the `spawn` method
/// (a DataLoader worker with `multiprocessing_context="spawn"`, a `Pool` under spawn): a new
/// program, but its parent's worker. `multiprocessing.spawn.get_command_line` ends it with
/// `--multiprocessing-fork`, which `spawn.is_forking` reads back.
pub fn is_spawned_worker(command: &[String]) -> bool {
    command
        .last()
        .is_some_and(|a| a == "--multiprocessing-fork")
}

/// A rank as the launcher's environment gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEnv {
    /// Which variables gave it.
    pub source: RankSource,
    /// The global rank.
    pub rank: u32,
    /// The rank on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// How many ranks the job has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
}

/// The variables of each source: (source, rank, local rank, world size), most specific first.
const RANK_VARS: [(RankSource, &str, &str, &str); 4] = [
    (RankSource::Torch, "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    (
        RankSource::Mpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ),
    (RankSource::Mpi, "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    (
        RankSource::Slurm,
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NTASKS",
    ),
];

impl RankEnv {
    /// The most specific rank `var` (an environment lookup) gives; a value that is not a number
    /// gives none.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<RankEnv> {
        let num = |name: &str| var(name).and_then(|v| v.trim().parse::<u32>().ok());
        RANK_VARS
            .iter()
            .find_map(|&(source, rank, local, size)| {
                Some(RankEnv {
                    source,
                    rank: num(rank)?,
                    local_rank: num(local),
                    world_size: num(size),
                })
            })
            .or_else(|| Self::from_local(&num))
    }

    /// A rank from `LOCAL_RANK` alone, the way launchers that start each rank with its local rank
    /// and node rank but no `RANK` give it (Lightning's and Fabric's subprocess launcher, whose
    /// global rank is `NODE_RANK × ranks per node + LOCAL_RANK`): the global rank is the local
    /// one on node 0 (`NODE_RANK`, else `GROUP_RANK`, absent or 0), and on another node only
    /// when `LOCAL_WORLD_SIZE` gives the ranks per node.
    fn from_local(num: &impl Fn(&str) -> Option<u32>) -> Option<RankEnv> {
        let local = num("LOCAL_RANK")?;
        let node = num("NODE_RANK").or_else(|| num("GROUP_RANK")).unwrap_or(0);
        let rank = if node == 0 {
            local
        } else {
            node.checked_mul(num("LOCAL_WORLD_SIZE")?)?
                .checked_add(local)?
        };
        Some(RankEnv {
            source: RankSource::Torch,
            rank,
            local_rank: Some(local),
            world_size: num("WORLD_SIZE"),
        })
    }

    /// This process's rank, from its environment.
    pub fn from_env() -> Option<RankEnv> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}

/// What a process under `memsight run` says of itself in its greeting (wire 1.6).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its parent's pid when the session started.
    #[serde(default)]
    pub ppid: u32,
    /// Its rank, when a distributed launcher's environment gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<RankEnv>,
    /// A child forked from a measured process that has not exec'd (a DataLoader worker, a
    /// multiprocessing child): its heap starts as its parent's, copy-on-write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forked: bool,
    /// The live heap bytes it had from its parent at the fork (its own growth is the rest).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inherited_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A process's role in its job, as the sidecar assembles the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "role")]
pub enum Role {
    /// The job itself, when it has no ranks: the measured process with the largest heap that is
    /// not a forked worker.
    Main,
    /// Rank N: the top-most process that carries rank N.
    Rank {
        /// The global rank.
        rank: u32,
    },
    /// A forked worker (DataLoader, multiprocessing) of rank N, or of the main process.
    Worker {
        /// Its rank, if it works for one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    /// Started the ranks or the main process (a shell, `torchrun`, a shim, `srun`).
    Launcher,
    /// Any other program the job ran.
    Helper {
        /// The rank whose process started it, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
}

impl Role {
    /// `rank 1`, `worker of rank 0`, `launcher`…
    pub fn describe(&self) -> String {
        match self {
            Role::Main => "main process".into(),
            Role::Rank { rank } => format!("rank {rank}"),
            Role::Worker { rank: Some(r) } => format!("worker of rank {r}"),
            Role::Worker { rank: None } => "worker".into(),
            Role::Launcher => "launcher".into(),
            Role::Helper { rank: Some(r) } => format!("helper of rank {r}"),
            Role::Helper { rank: None } => "helper".into(),
        }
    }
}

/// How a measured process ended, as far as the sidecar learned it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEnd {
    /// `exited` (with a code), `killed` (it ended without exiting: a signal), `oom_killed` (the
    /// kernel's OOM killer named it, or it vanished with an OOM kill counted in its cgroup),
    /// `running` (still running when the report was written).
    pub kind: String,
    /// Exit code, for `exited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// When it ended, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_ms: Option<u64>,
    /// One line for people.
    pub description: String,
}

impl ProcessEnd {
    /// Whether this end is a failure (a kill, or an exit with a code other than 0).
    pub fn failed(&self) -> bool {
        match self.kind.as_str() {
            "exited" => self.code.is_some_and(|c| c != 0),
            "killed" | "oom_killed" => true,
            _ => false,
        }
    }
}

/// One measured process of the job, in the job report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobProcess {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Its role (`main`, `rank`, `worker`, `launcher`, `helper`).
    #[serde(flatten)]
    pub role: Option<Role>,
    /// Command line.
    pub command: Vec<String>,
    /// Peak live heap bytes of its own (a forked worker's without what it inherited).
    pub heap_peak_bytes: u64,
    /// Highest RSS sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_peak_bytes: Option<u64>,
    /// Its last PSS and USS sampled from outside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pss_bytes: Option<u64>,
    /// See `last_pss_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_uss_bytes: Option<u64>,
    /// The last step and phase it recorded.
    #[serde(default)]
    pub last_step: u64,
    /// See `last_step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_phase: Option<String>,
    /// How it ended.
    pub end: ProcessEnd,
    /// Its own report (ranks), when one was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
}

impl JobProcess {
    /// The role's words (`rank 1`, `worker of rank 0`…).
    pub fn role_text(&self) -> String {
        self.role.map_or_else(|| "process".into(), |r| r.describe())
    }
}
