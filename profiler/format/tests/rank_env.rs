//! Ranks read from a launcher's environment: every launcher's variables, including those that
//! give a rank its local rank and node rank only (Lightning's subprocess launcher).

use memsight_format::process::{RankEnv, RankSource};

fn rank_of(vars: &[(&str, &str)]) -> Option<RankEnv> {
    RankEnv::from_vars(|k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    })
}

#[test]
fn a_global_rank_variable_wins_over_a_local_one() {
    let r = rank_of(&[("RANK", "5"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "8")]).unwrap();
    assert_eq!(
        (r.source, r.rank, r.local_rank, r.world_size),
        (RankSource::Torch, 5, Some(1), Some(8))
    );
    let r = rank_of(&[("SLURM_PROCID", "3"), ("LOCAL_RANK", "0")]).unwrap();
    assert_eq!((r.source, r.rank), (RankSource::Slurm, 3));
}

/// Lightning's `ddp` strategy starts rank N > 0 with `LOCAL_RANK=N`, `NODE_RANK` and `WORLD_SIZE`
/// and no `RANK`: on node 0 the local rank is the global one.
#[test]
fn a_local_rank_alone_is_the_rank_on_node_zero() {
    let r = rank_of(&[("LOCAL_RANK", "1"), ("NODE_RANK", "0"), ("WORLD_SIZE", "2")]).unwrap();
    assert_eq!(
        (r.source, r.rank, r.local_rank, r.world_size),
        (RankSource::Torch, 1, Some(1), Some(2))
    );
    let r = rank_of(&[("LOCAL_RANK", "3")]).unwrap();
    assert_eq!(r.rank, 3);
}

#[test]
fn on_another_node_a_local_rank_needs_the_ranks_per_node() {
    assert_eq!(
        rank_of(&[
            ("LOCAL_RANK", "1"),
            ("NODE_RANK", "2"),
            ("WORLD_SIZE", "12")
        ]),
        None
    );
    let r = rank_of(&[
        ("LOCAL_RANK", "1"),
        ("NODE_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("WORLD_SIZE", "12"),
    ])
    .unwrap();
    assert_eq!((r.rank, r.local_rank), (9, Some(1)));
    let r = rank_of(&[
        ("LOCAL_RANK", "0"),
        ("GROUP_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
    ])
    .unwrap();
    assert_eq!(r.rank, 2);
    assert_eq!(rank_of(&[("LOCAL_RANK", "x")]), None);
    assert_eq!(
        rank_of(&[
            ("LOCAL_RANK", "1"),
            ("NODE_RANK", "4294967295"),
            ("LOCAL_WORLD_SIZE", "2")
        ]),
        None
    );
}
