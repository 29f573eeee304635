//! A VDI boot storm on a four-host cluster in one process, with real
//! clients: an ext4 root file system built from this machine's own files
//! (`mkfs.ext4 -d`) is written into a datastore volume with `qemu-img`,
//! cloned 8 times inside the volume with EXTENDED COPY (the libiscsi
//! initiator `tests/tools/xcopy_range.c`, as ESXi clones VMs inside one VMFS
//! datastore, so every clone shares the stored blocks), then the 8 clones
//! boot at once: 8 libnbd readers (`tests/tools/boot_reader.py`) read the
//! same files in the same order, each file's blocks (from `debugfs`) in
//! runs of up to 128 KiB. Every clone reads the bytes of the image, and the
//! disk groups' content-based read cache (`DiskGroup::content_cache_stats`)
//! serves a shared block read by several clones from one device read: at
//! least 80% of the blocks read come from the cache, and the devices read
//! at most 1.5 times what one clone reads. Twice: on a datastore of one
//! stripe column (the owner reads its own copy) and of three (the owner
//! holds no copy of some column, whose copies each serve half its 1 MiB
//! regions).
//!
//! A second test runs fio with CRC32C verification over one range of a
//! volume while EXTENDED COPY, UNMAP and WRITE SAME change other ranges of
//! it through iSCSI, then reads everything back. A third writes passes of
//! fio, each marking its blocks, and checks them through every host while
//! the volume's owner moves (its host stops, later a resize hands it back),
//! with the host read cache and the disk groups' content caches serving
//! reads: no host ever serves a block of an older pass.

mod fixture;

use fixture::{
    expect_fio_success, fio_outcome, have, qemu_io, run, wait_for_target, xcopy, xcopy_client,
    Cluster,
};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_node::control::{
    ClusterControl, CreatePolicy, CreateVolume, Health, ReadCacheView, ResizeVolume,
};
use tessera_store::ContentCacheStats;

const MIB: u64 = 1 << 20;
/// The file system's block and the store's block.
const BLOCK_BYTES: u64 = 4096;
/// Clones that boot at once.
const CLONES: u64 = 8;
/// Size of the root file system image.
const IMAGE_BYTES: u64 = 160 * MIB;
/// Where image `k` (0: the template, 1..=8: the clones) starts in the
/// datastore volume. A multiple of 3 MiB (the stripe of three 1 MiB units),
/// so a clone's blocks land in the template's column and are shared. And
/// an even number of MiB per column: when no copy of a column is on the
/// owner, the column's copies each serve every other 1 MiB region of it,
/// and an even stride puts the same block of every clone in regions served
/// by the same copy, so only that copy's disk group reads it from a device
/// (with 165 MiB, 55 MiB per column, the striped datastore's devices read
/// 1.33 times what one clone reads instead of 1.00).
const SLOT_BYTES: u64 = 168 * MIB;
/// Longest read of a booting guest (its readahead).
const READ_BLOCKS_MAX: u64 = (128 * 1024) / BLOCK_BYTES;
/// Files larger than this are not staged: a root file system of many files.
const FILE_BYTES_MAX: u64 = 4 * MIB;

/// Whether Debian's python3 with the libnbd bindings is there (a python3
/// earlier on PATH, such as pyenv's, has no `nbd` module).
fn have_python_nbd() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import nbd"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "/usr/bin/python3 with libnbd (python3-libnbd) is required (TESSERA_REQUIRE_TOOLS=1)"
        );
        eprintln!("skipping: /usr/bin/python3 cannot import nbd (install python3-libnbd)");
    }
    ok
}

fn tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools")
        .join(name)
}

/// A name debugfs takes without quoting.
fn plain_name(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|n| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-@".contains(&b))
    })
}

/// Copies the readable regular files under `from` (sorted, recursively,
/// symbolic links not followed) to `to` while their blocks fit in
/// `budget`, pushing each one's path inside the image onto `files`.
fn stage_tree(from: &Path, to: &Path, inside: &str, budget: &mut u64, files: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if !plain_name(&name) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        let (src, dst) = (entry.path(), to.join(&name));
        let path = format!("{inside}/{}", name.to_str().unwrap());
        if meta.is_dir() {
            if std::fs::create_dir_all(&dst).is_ok() {
                stage_tree(&src, &dst, &path, budget, files);
            }
        } else if meta.is_file() && meta.len() <= FILE_BYTES_MAX {
            let blocks_bytes = meta.len().div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
            if blocks_bytes > *budget {
                continue;
            }
            // Unreadable files (/etc/shadow and the like) are left out.
            if std::fs::copy(&src, &dst).is_ok() {
                *budget -= blocks_bytes;
                files.push(path);
            }
        }
    }
}

/// Stages part of this machine's root file system in `staging`: all of
/// /etc that a user can read and the first files of /usr/bin and
/// /usr/lib/x86_64-linux-gnu, about 100 MiB. Returns the regular files'
/// paths inside the image.
fn stage_root(staging: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for (from, budget) in [
        ("/etc", 4 * MIB),
        ("/usr/bin", 40 * MIB),
        ("/usr/lib/x86_64-linux-gnu", 56 * MIB),
    ] {
        let to = staging.join(from.trim_start_matches('/'));
        std::fs::create_dir_all(&to).unwrap();
        let mut left = budget;
        stage_tree(Path::new(from), &to, from, &mut left, &mut files);
    }
    files
}

/// A fixed permutation of `items` (xorshift, Fisher-Yates): the order a
/// boot opens its files in, the same for every clone and every run.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        items.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// The data blocks of each of `files` in `image`, from one `debugfs` run.
fn file_blocks(dir: &Path, image: &Path, files: &[String]) -> Vec<Vec<u64>> {
    let commands = dir.join("blocks.debugfs");
    let text: String = files.iter().map(|f| format!("blocks {f}\n")).collect();
    std::fs::write(&commands, text).unwrap();
    let out = Command::new("debugfs")
        .arg("-f")
        .arg(&commands)
        .arg(image)
        .output()
        .expect("debugfs starts");
    assert!(
        out.status.success(),
        "debugfs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut blocks: Vec<Vec<u64>> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with("debugfs: blocks ") {
            blocks.push(Vec::new());
        } else if let Some(current) = blocks.last_mut() {
            for word in line.split_whitespace() {
                current.push(word.parse().unwrap_or_else(|_| {
                    panic!(
                        "debugfs printed {line:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                }));
            }
        }
    }
    assert_eq!(
        blocks.len(),
        files.len(),
        "one answer per file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    blocks
}

/// The reads of a boot: each file's blocks in runs of consecutive blocks
/// of at most [`READ_BLOCKS_MAX`], as lines "FILE FIRST BLOCKS".
fn boot_reads(blocks: &[Vec<u64>]) -> (String, u64) {
    let mut text = String::new();
    let mut total = 0;
    for (file, blocks) in blocks.iter().enumerate() {
        let mut i = 0;
        while i < blocks.len() {
            let first = blocks[i];
            let mut n = 1;
            while i + (n as usize) < blocks.len()
                && blocks[i + n as usize] == first + n
                && n < READ_BLOCKS_MAX
            {
                n += 1;
            }
            text.push_str(&format!("{file} {first} {n}\n"));
            total += n;
            i += n as usize;
        }
    }
    (text, total)
}

/// Physical bytes of every disk group of the datastore, as the API shows
/// them, once every disk group has moved its write log to the capacity
/// tier.
async fn physical_bytes(cluster: &Cluster) -> u64 {
    settle(cluster).await;
    ClusterControl::hosts(cluster.control.as_ref())
        .await
        .unwrap()
        .iter()
        .flat_map(|h| &h.disk_groups)
        .map(|g| g.physical_bytes.expect("a host of this process"))
        .sum()
}

/// Waits until every disk group has moved its write log to the capacity
/// tier, where reads go through the content cache.
async fn settle(cluster: &Cluster) {
    for host in cluster.control.hosts().running() {
        for group in host.replica().disk_groups() {
            group.settle().await.expect("disk group settles");
        }
    }
}

/// The content caches' counters summed over every disk group of every host.
fn content_cache(cluster: &Cluster) -> ContentCacheStats {
    let mut sum = ContentCacheStats::default();
    for host in cluster.control.hosts().running() {
        for group in host.replica().disk_groups() {
            let s = group.content_cache_stats();
            sum.hits += s.hits;
            sum.joined += s.joined;
            sum.misses += s.misses;
            sum.inserted += s.inserted;
            sum.evicted += s.evicted;
            sum.invalidated += s.invalidated;
            sum.entries += s.entries;
            sum.budget_bytes += s.budget_bytes;
        }
    }
    sum
}

/// Per-file CRCs a reader printed, and its closing line.
fn crcs(output: &str) -> (Vec<&str>, &str) {
    let mut lines: Vec<&str> = output.lines().collect();
    let last = lines.pop().unwrap_or_default();
    assert!(
        last.starts_with("read "),
        "the reader did not finish: {output}"
    );
    (lines, last)
}

/// Boots the clones at once: one reader per clone connects, and when all
/// are connected all start. Returns each reader's output and the time from
/// the start to the last one's end.
fn boot(uri: &str, runs: &Path) -> (Vec<String>, Duration) {
    let script = tool("boot_reader.py");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(CLONES as usize + 1));
    let readers: Vec<_> = (1..=CLONES)
        .map(|k| {
            let (script, uri, runs) = (script.clone(), uri.to_string(), runs.to_path_buf());
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut child = Command::new("/usr/bin/python3")
                    .arg(&script)
                    .arg(&uri)
                    .arg((k * SLOT_BYTES).to_string())
                    .arg(&runs)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("python3 starts");
                let mut stdout = BufReader::new(child.stdout.take().unwrap());
                let mut ready = String::new();
                stdout.read_line(&mut ready).unwrap();
                barrier.wait();
                if ready.trim() == "ready" {
                    let mut stdin = child.stdin.take().unwrap();
                    stdin.write_all(b"go\n").unwrap();
                }
                let mut rest = String::new();
                std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
                let out = child.wait_with_output().unwrap();
                assert!(
                    out.status.success() && ready.trim() == "ready",
                    "the reader of clone {k} failed: {ready}{rest}{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                rest
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let outputs = readers.into_iter().map(|r| r.join().unwrap()).collect();
    (outputs, start.elapsed())
}

/// Content-cache misses (device reads) of each host's disk groups.
fn misses_per_host(cluster: &Cluster) -> BTreeMap<String, u64> {
    cluster
        .control
        .hosts()
        .running()
        .iter()
        .map(|h| {
            let misses = h
                .replica()
                .disk_groups()
                .iter()
                .map(|g| g.content_cache_stats().misses)
                .sum();
            (h.id().to_string(), misses)
        })
        .collect()
}

/// A root file system image and the reads of its boot.
struct Boot<'a> {
    /// The EXTENDED COPY initiator.
    client: &'a Path,
    /// The template's image file.
    image: &'a Path,
    /// The boot's reads (lines "FILE FIRST BLOCKS").
    runs: &'a Path,
    /// The image's files in reading order.
    files: &'a [String],
    /// The CRC of each file's blocks in the image, as the reader prints them.
    gold: &'a [&'a str],
    /// Blocks one boot reads.
    blocks: u64,
}

impl Boot<'_> {
    /// Writes the template at the start of a new datastore volume through
    /// its owner's NBD server, clones it 8 times inside the volume with
    /// EXTENDED COPY through the owner's iSCSI portal (checking the clones
    /// share the stored blocks), boots the 8 clones at once through the
    /// owner's NBD server, checks each read the template's bytes, and
    /// checks the content caches served the shared blocks.
    async fn storm(&self, cluster: &Cluster, name: &str, policy: Option<&str>) {
        let boot_bytes = self.blocks * BLOCK_BYTES;
        cluster
            .control
            .create_volume(CreateVolume {
                name: name.into(),
                size_bytes: (CLONES + 1) * SLOT_BYTES,
                policy: policy.map(Into::into),
                block_bytes: None,
            })
            .await
            .expect("volume created");
        let view = cluster
            .wait_for(name, "an owner", |v| {
                v.owner.is_some() && v.state == Health::Healthy
            })
            .await;
        let owner = view.owner.clone().expect("an owner");
        let copies: Vec<(usize, String)> = view
            .components
            .iter()
            .filter_map(|c| c.column.map(|col| (col, c.host.clone())))
            .collect();
        eprintln!("{name}: owned by {owner}, copies (column, host) {copies:?}");
        let url = cluster.iscsi_url(&owner, name);
        wait_for_target(&url).await;
        let empty = physical_bytes(cluster).await;
        let nbd = cluster.nbd_uri(&owner, name);
        let (file, target) = (self.image.to_str().unwrap().to_string(), nbd.clone());
        tokio::task::spawn_blocking(move || {
            run(
                "qemu-img",
                &["convert", "-n", "-f", "raw", "-O", "raw", &file, &target],
            )
        })
        .await
        .unwrap();
        let written = physical_bytes(cluster).await;
        assert!(
            written - empty >= 2 * boot_bytes,
            "two copies of the {boot_bytes} bytes of files take {} bytes",
            written - empty
        );

        // 8 clones inside the datastore, as ESXi clones VMs in one VMFS
        // datastore: the clones share the template's stored blocks.
        let cloning = Instant::now();
        for k in 1..=CLONES {
            xcopy(self.client, &url, k * SLOT_BYTES, &url, 0, IMAGE_BYTES).await;
        }
        let cloning = cloning.elapsed();
        let cloned = physical_bytes(cluster).await;
        eprintln!(
            "{name}: the template takes {} bytes on the disk groups; {CLONES} clones in {cloning:?} added {} bytes",
            written - empty,
            cloned - written
        );
        assert!(
            cloned - written < (written - empty) / 4,
            "{CLONES} clones of {} bytes grew the physical usage by {} bytes",
            written - empty,
            cloned - written
        );
        let object = cluster.control.object(name).await.unwrap();
        assert_eq!(object.offloads.clone_shared_bytes, CLONES * IMAGE_BYTES);

        // The boot storm, through the owner's NBD server.
        settle(cluster).await;
        let before = content_cache(cluster);
        let host_before = misses_per_host(cluster);
        let (outputs, took) = tokio::task::spawn_blocking({
            let (nbd, runs) = (nbd.clone(), self.runs.to_path_buf());
            move || boot(&nbd, &runs)
        })
        .await
        .unwrap();
        let after = content_cache(cluster);
        let device_reads: BTreeMap<String, u64> = misses_per_host(cluster)
            .into_iter()
            .map(|(h, m)| {
                let d = m - host_before.get(&h).copied().unwrap_or(0);
                (h, d)
            })
            .filter(|(_, d)| *d > 0)
            .collect();
        for (k, output) in outputs.iter().enumerate() {
            let (clone_crcs, summary) = crcs(output);
            eprintln!("{name}: clone {}: {summary}", k + 1);
            assert_eq!(clone_crcs.len(), self.gold.len());
            if let Some((i, (got, want))) = clone_crcs
                .iter()
                .zip(self.gold)
                .enumerate()
                .find(|(_, (a, b))| a != b)
            {
                let file: usize = want.split(' ').next().unwrap().parse().unwrap();
                panic!(
                    "{name}: clone {} read other bytes than the image for {} (line {i}: {got} != {want})",
                    k + 1,
                    self.files[file]
                );
            }
        }
        let hits = after.hits - before.hits;
        let joined = after.joined - before.joined;
        let misses = after.misses - before.misses;
        let served = hits + joined + misses;
        let hit_rate = (hits + joined) as f64 / served.max(1) as f64;
        let device_bytes = misses * BLOCK_BYTES;
        eprintln!(
            "{name}: boot storm of {CLONES} clones in {took:?}: {served} capacity blocks read \
             ({hits} hits, {joined} joined, {misses} misses; {} evicted); cache hit rate {:.1}%; \
             device reads {device_bytes} bytes = {:.2} x the {boot_bytes} bytes one clone reads \
             (blocks per host: {device_reads:?})",
            after.evicted - before.evicted,
            hit_rate * 100.0,
            device_bytes as f64 / boot_bytes as f64
        );
        assert_eq!(
            served,
            CLONES * self.blocks,
            "every block the clones read came from the capacity tier"
        );
        assert!(
            hit_rate >= 0.80,
            "{name}: cache hit rate {hit_rate:.3} < 0.80"
        );
        assert!(
            device_bytes * 2 <= boot_bytes * 3,
            "{name}: the devices read {device_bytes} bytes for a boot of {boot_bytes} bytes per clone"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clones_booting_at_once_read_each_shared_block_from_a_device_once() {
    let began = Instant::now();
    if !have("mkfs.ext4")
        || !have("debugfs")
        || !have("qemu-img")
        || !have("iscsi-inq")
        || !have_python_nbd()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = xcopy_client(dir.path()) else {
        return;
    };

    // The root file system of the template VM, from this machine's files.
    let staging = dir.path().join("root");
    let mut files = stage_root(&staging);
    let staged_bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(staging.join(&f[1..])).unwrap().len())
        .sum();
    let image = dir.path().join("root.img");
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-d",
            staging.to_str().unwrap(),
            image.to_str().unwrap(),
            &format!("{}M", IMAGE_BYTES / MIB),
        ],
    );
    shuffle(&mut files, 0x5eed_b007);
    let blocks = file_blocks(dir.path(), &image, &files);
    let (reads, boot_blocks) = boot_reads(&blocks);
    let runs = dir.path().join("boot.runs");
    std::fs::write(&runs, &reads).unwrap();
    let boot_bytes = boot_blocks * BLOCK_BYTES;
    eprintln!(
        "root file system: {} files, {staged_bytes} bytes staged; a boot reads {boot_bytes} bytes in {} reads",
        files.len(),
        reads.lines().count()
    );
    assert!(
        files.len() >= 500 && boot_bytes >= 48 * MIB,
        "too little of a root file system on this machine: {} files, {boot_bytes} bytes",
        files.len()
    );
    // What every clone must read: the template image's bytes.
    let gold = run(
        "/usr/bin/python3",
        &[
            tool("boot_reader.py").to_str().unwrap(),
            image.to_str().unwrap(),
            "0",
            runs.to_str().unwrap(),
        ],
    );
    let (gold_crcs, _) = crcs(&gold);
    assert_eq!(
        gold_crcs.len(),
        files
            .iter()
            .zip(&blocks)
            .filter(|(_, b)| !b.is_empty())
            .count()
    );

    let cluster = Cluster::start(3600).await;
    let boot = Boot {
        client: &client,
        image: &image,
        runs: &runs,
        files: &files,
        gold: &gold_crcs,
        blocks: boot_blocks,
    };
    // One column: the owner holds a copy of all of it, and reads it.
    boot.storm(&cluster, "datastore", None).await;
    // Each clone holds space for the blocks it shares (an overwrite needs
    // blocks of its own): the 1 GiB hosts have room for one such datastore.
    cluster
        .control
        .delete_volume("datastore", false)
        .await
        .expect("datastore deleted");
    // Three columns on four hosts: the owner (the first host of a copy)
    // holds copies of some columns only, and the copies of each other
    // column each serve every other 1 MiB region of it.
    cluster
        .control
        .create_policy(CreatePolicy {
            name: "striped".into(),
            failures_to_tolerate: 1,
            stripe_width: 3,
            space_reservation_pct: 0,
            qos: Default::default(),
        })
        .await
        .unwrap();
    boot.storm(&cluster, "striped", Some("striped")).await;
    cluster.stop().await;
    eprintln!("boot storm test took {:?}", began.elapsed());
}

/// What fio writes in each 4 KiB block, and checks when it reads it back.
#[derive(Clone, Copy, Debug)]
enum Content {
    /// Random data under a header with the block's offset and a CRC32C: a
    /// torn, corrupt or misplaced block fails. The header does not say
    /// which run of fio wrote the block, so a pass that only reads cannot
    /// tell an older block from a newer one.
    Crc32c,
    /// Pass `n`'s mark (a byte, not 0) and the block's offset, over and
    /// over (`verify=pattern`, every byte compared): a block that another
    /// pass wrote fails too, as does a zeroed or misplaced one.
    Pass(u8),
}

/// What one run of fio does.
#[derive(Clone, Copy, Debug)]
enum Phases {
    /// Writes every block once, in random order.
    Write,
    /// Reads every block back and checks it.
    Verify,
    /// Both, one after the other.
    WriteAndVerify,
}

/// fio over the first `mib` MiB of the volume at `uri`: random 4 KiB
/// writes of every block with `content`, a read of every block checked, or
/// both.
fn fio_verify(uri: &str, mib: u64, content: Content, phases: Phases) -> std::process::Child {
    let mut args = vec![
        "--name=verify".to_string(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--iodepth=8".into(),
        "--offset=0".into(),
        format!("--size={mib}M"),
        "--verify_fatal=1".into(),
        "--verify_state_save=0".into(),
        "--output-format=terse".into(),
    ];
    match content {
        Content::Crc32c => args.push("--verify=crc32c".into()),
        Content::Pass(n) => {
            assert_ne!(n, 0, "a pass's mark is not a byte of unwritten blocks");
            args.push("--verify=pattern".into());
            args.push(format!("--verify_pattern={n:#04x}%o"));
        }
    }
    match phases {
        Phases::Write => args.push("--do_verify=0".into()),
        Phases::Verify => args.push("--verify_only".into()),
        Phases::WriteAndVerify => args.push("--do_verify=1".into()),
    }
    Command::new("fio")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fio_verify_stays_clean_while_xcopy_unmap_and_write_same_change_other_ranges() {
    if !have("fio") || !have("qemu-io") || !have("iscsi-inq") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(client) = xcopy_client(dir.path()) else {
        return;
    };
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", 256 * MIB).await;
    let owner = view.owner.clone().expect("an owner");
    let url = cluster.iscsi_url(&owner, "vm");
    wait_for_target(&url).await;
    let nbd = cluster.nbd_uri(&owner, "vm");

    // [64M, 96M): the source of the copies; [128M, 160M): their target;
    // [192M, 224M): unmapped and zeroed; [224M, 256M): left alone.
    qemu_io(&url, &["write -P 0x3c 64M 32M", "write -P 0x77 224M 32M"]).await;
    let mut fio = Some(fio_verify(
        &nbd,
        64,
        Content::Crc32c,
        Phases::WriteAndVerify,
    ));
    let mut rounds = 0;
    loop {
        qemu_io(&url, &["write -P 0xa5 192M 32M", "discard 128M 32M"]).await;
        xcopy(&client, &url, 128 * MIB, &url, 64 * MIB, 32 * MIB).await;
        qemu_io(
            &url,
            &["discard 192M 8M", "write -z 200M 8M", "write -z -u 208M 8M"],
        )
        .await;
        rounds += 1;
        let running = fio.as_mut().unwrap().try_wait().unwrap().is_none();
        if !running {
            break;
        }
    }
    expect_fio_success(fio.take().unwrap()).await;
    eprintln!(
        "{rounds} rounds of EXTENDED COPY, UNMAP and WRITE SAME while fio wrote and verified"
    );

    // fio reads back everything it wrote once more, now that nothing else
    // changes the volume; every other range holds what was last put there.
    expect_fio_success(fio_verify(&nbd, 64, Content::Crc32c, Phases::Verify)).await;
    for (pattern, range) in [
        (0x3c, "64M 32M"),
        (0x3c, "128M 32M"),
        (0, "192M 24M"),
        (0xa5, "216M 8M"),
        (0x77, "224M 32M"),
    ] {
        let read = qemu_io(&url, &[&format!("read -P {pattern:#x} {range}")]).await;
        assert!(
            !read.contains("Pattern verification failed"),
            "{range}: {read}"
        );
    }
    let object = cluster.control.object("vm").await.unwrap();
    eprintln!("offloads: {:?}", object.offloads);
    assert!(object.offloads.clone_shared_bytes >= rounds * 32 * MIB);
    assert!(object.offloads.zero_blocks > 0, "{:?}", object.offloads);
    assert!(object.offloads.delete_blocks > 0, "{:?}", object.offloads);
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "copies differ: {report:?}");
    cluster.stop().await;
}

/// What fio covers while the owner moves: small enough for the default
/// read cache budget of a host with 5 GiB of memory or more (0.4% of it),
/// so a pass read twice is served from memory the second time.
const MOVE_RANGE_MIB: u64 = 16;

/// Host `id`'s read cache, as `tessera host show` prints it.
async fn read_cache_of(cluster: &Cluster, id: &str) -> ReadCacheView {
    cluster
        .control
        .host(id)
        .await
        .unwrap()
        .read_cache
        .expect("a host of this process")
}

/// fio over [`MOVE_RANGE_MIB`] of volume `vm` through `host`'s NBD server.
fn fio_on_vm(
    cluster: &Cluster,
    host: &str,
    content: Content,
    phases: Phases,
) -> std::process::Child {
    fio_verify(
        &cluster.nbd_uri(host, "vm"),
        MOVE_RANGE_MIB,
        content,
        phases,
    )
}

/// [`fio_on_vm`], failing the test unless fio passed.
async fn fio_through(cluster: &Cluster, host: &str, content: Content, phases: Phases) {
    let started = Instant::now();
    expect_fio_success(fio_on_vm(cluster, host, content, phases)).await;
    eprintln!(
        "{content:?} {phases:?} through {host}: {:?}",
        started.elapsed()
    );
}

/// With both read caches on (the host read cache of the volumes a host
/// owns, and each disk group's content cache of capacity blocks), fio's
/// checked reads through every host see the pass fio wrote last, while the
/// volume's owner moves: from a host that stops to the host of the other
/// copy, which serves the first pass from its disk group's content cache
/// and the second pass from its read cache; and, once the first host has
/// returned and its copy is resynced, back to it by a resize, while the
/// second owner keeps running with the second pass in its read cache (a
/// third pass is written through it after the move). Each pass marks its
/// blocks, so a block of an earlier pass served from any cache fails the
/// check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fio_verify_sees_the_newest_pass_through_every_host_while_the_owner_moves_with_both_read_caches_on(
) {
    if !have("fio") {
        return;
    }
    let began = Instant::now();
    let cluster = Cluster::start(3600).await;
    let view = cluster.create("vm", 64 * MIB).await;
    let first = view.owner.clone().expect("an owner");
    let first_epoch = view.epoch.expect("an epoch");
    let hosts: Vec<String> = (1..=cluster.config.hosts)
        .map(|k| format!("host-{k}"))
        .collect();
    let other = |not: &[&String]| -> String {
        hosts
            .iter()
            .find(|h| !not.contains(h))
            .expect("a host")
            .clone()
    };
    assert!(
        read_cache_of(&cluster, &first).await.budget_bytes > 0,
        "the host read cache is on by default"
    );
    assert!(
        content_cache(&cluster).budget_bytes > 0,
        "the content cache is on by default"
    );

    // Pass 1, written and read back through the owner; read again through
    // another host, whose reads the owner serves from its read cache.
    fio_through(&cluster, &first, Content::Pass(1), Phases::WriteAndVerify).await;
    let before = read_cache_of(&cluster, &first).await;
    fio_through(
        &cluster,
        &other(&[&first]),
        Content::Pass(1),
        Phases::Verify,
    )
    .await;
    let after = read_cache_of(&cluster, &first).await;
    eprintln!("{first}'s read cache before and after reading pass 1 again: {before:?} {after:?}");
    assert!(
        after.hits > before.hits,
        "the owner served reads from its read cache: {after:?}"
    );
    // The copies move to the capacity tier and are compared. A verify reads
    // each block once, past the disk groups' content caches: it neither
    // finds blocks there nor leaves any for the guests to lose theirs to.
    settle(&cluster).await;
    let content_before = content_cache(&cluster);
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "copies differ: {report:?}");
    let content_after = content_cache(&cluster);
    assert_eq!(
        (
            content_after.hits,
            content_after.misses,
            content_after.inserted
        ),
        (
            content_before.hits,
            content_before.misses,
            content_before.inserted
        ),
        "a verify went through the content caches"
    );

    // The owner stops; the host of the other copy takes over.
    cluster.control.stop_host(&first).await.unwrap();
    let moved = cluster
        .wait_for("vm", "a new owner", |v| {
            v.owner.as_deref().is_some_and(|o| o != first)
        })
        .await;
    let second = moved.owner.clone().unwrap();
    let second_epoch = moved.epoch.unwrap();
    assert!(second_epoch > first_epoch, "the epoch rises with the owner");
    eprintln!("ownership moved from {first} ({first_epoch}) to {second} ({second_epoch})");
    // Pass 1 is intact. The new owner has nothing in its read cache, so
    // its disk groups serve the reads, through their content caches, which
    // keep what they read.
    let content_before = content_cache(&cluster);
    let before = read_cache_of(&cluster, &second).await;
    fio_through(&cluster, &second, Content::Pass(1), Phases::Verify).await;
    let content_after = content_cache(&cluster);
    let after = read_cache_of(&cluster, &second).await;
    eprintln!(
        "reading pass 1 through the new owner: {} content cache hits, {} misses; read cache {after:?}",
        content_after.hits - content_before.hits,
        content_after.misses - content_before.misses
    );
    assert!(
        content_after.misses > content_before.misses
            && content_after.inserted > content_before.inserted,
        "the disk groups served blocks through their content caches: {content_after:?}"
    );
    assert!(after.misses > before.misses, "{after:?}");

    // Pass 2 through a third host, to the new owner, whose read cache and
    // disk group hold pass 1; read back through every running host once
    // the blocks are in the capacity tier.
    let third = other(&[&first, &second]);
    fio_through(&cluster, &third, Content::Pass(2), Phases::Write).await;
    settle(&cluster).await;
    for host in hosts.iter().filter(|h| **h != first) {
        fio_through(&cluster, host, Content::Pass(2), Phases::Verify).await;
    }
    let warm = read_cache_of(&cluster, &second).await;
    assert!(
        warm.hits > after.hits && warm.cached_bytes > 0,
        "the new owner served pass 2 from its read cache: {warm:?}"
    );

    // The first host returns, and its copy is resynced; through it, pass 2
    // reads back and pass 1 is nowhere.
    cluster.control.start_host(&first).await.unwrap();
    cluster
        .wait_for("vm", "the returning copy to be resynced", |v| {
            v.state == Health::Healthy
        })
        .await;
    fio_through(&cluster, &first, Content::Pass(2), Phases::Verify).await;
    let (passed, output) = fio_outcome(fio_on_vm(
        &cluster,
        &first,
        Content::Pass(1),
        Phases::Verify,
    ))
    .await;
    assert!(
        !passed && output.contains("got pattern"),
        "no block of pass 1 is left: {output}"
    );
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "copies differ: {report:?}");

    // A resize hands ownership over again: the owner steps down; the first
    // host, which holds the first copy, takes over at its next look at the
    // directory, the second only at its second look (should the first be
    // that slow, another resize tries again). The second host keeps
    // running, and drops what it cached as soon as it steps down.
    let mut size = 64 * MIB;
    let back = loop {
        size += 64 * MIB;
        cluster
            .control
            .resize_volume("vm", ResizeVolume { size_bytes: size })
            .await
            .unwrap();
        let view = cluster
            .wait_for("vm", "an owner of the grown volume", |v| {
                v.owner.is_some() && v.state == Health::Healthy && v.size_bytes == size
            })
            .await;
        if view.owner.as_deref() != Some(second.as_str()) {
            break view;
        }
        assert!(size < 256 * MIB, "ownership stays with {second}");
    };
    let last = back.owner.clone().unwrap();
    eprintln!(
        "after growing to {size} bytes, {last} owns vm ({})",
        back.epoch.unwrap()
    );
    assert!(back.epoch.unwrap() > second_epoch);
    let dropped = read_cache_of(&cluster, &second).await;
    assert_eq!(dropped.cached_bytes, 0, "{dropped:?}");
    // The new owner starts with nothing cached and reads its own copy,
    // resynced while its host was away.
    fio_through(&cluster, &last, Content::Pass(2), Phases::Verify).await;
    // Pass 3 through the second host, read back through every host.
    fio_through(&cluster, &second, Content::Pass(3), Phases::WriteAndVerify).await;
    for host in &hosts {
        fio_through(&cluster, host, Content::Pass(3), Phases::Verify).await;
    }
    let report = cluster.control.verify_object("vm").await.unwrap();
    assert!(report.identical, "copies differ: {report:?}");
    cluster.stop().await;
    eprintln!("owner-move test took {:?}", began.elapsed());
}
