//! End-to-end tests of a child's tree that outlives SIGKILL: a grandchild stuck in
//! uninterruptible sleep (state D) while the child itself has exited. The lease stays
//! held (and renewed) until the last process of the tree is gone, so a standby never
//! starts beside it; with a cgroup and with the process group alone.
//!
//! State D is made for real: a write to a loop-mounted ext4 frozen with `fsfreeze` sleeps
//! uninterruptibly, deaf to SIGKILL, until the file system is thawed. That takes root (to
//! mount), which CI has: the tests fail, saying so, rather than skip without it.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Longer than the old bound on the wait for a stopped tree (--kill-after 1 s, then 5 s
/// after SIGKILL) and than one lease: time enough for a run that gave up on the stuck tree
/// to release, and for its standby to start.
const STUCK_FOR: Duration = Duration::from_secs(12);

/// A loop-mounted ext4, frozen: any write to it sleeps in state D until `thaw`. Thawed and
/// unmounted when dropped, whatever the test did.
struct FrozenFs {
    image: PathBuf,
    mount: PathBuf,
    frozen: bool,
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl FrozenFs {
    fn new(dir: &Path) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "these tests need root, to mount a loop device and freeze it (CI runs as root)"
        );
        let image = dir.join("fs.img");
        let mount = dir.join("frozen");
        fs::create_dir(&mount).expect("mkdir the mount point");
        fs::File::create(&image).and_then(|f| f.set_len(64 << 20)).expect("make the image");
        run("mkfs.ext4", &["-q", "-F", image.to_str().expect("utf-8")]);
        run("mount", &["-o", "loop", image.to_str().expect("utf-8"), mount.to_str().expect("utf-8")]);
        // Writable by the unprivileged user of the process-group test too.
        fs::set_permissions(&mount, fs::Permissions::from_mode(0o777)).expect("chmod the mount");
        run("fsfreeze", &["-f", mount.to_str().expect("utf-8")]);
        Self { image, mount, frozen: true }
    }

    fn thaw(&mut self) {
        if std::mem::take(&mut self.frozen) {
            run("fsfreeze", &["-u", self.mount.to_str().expect("utf-8")]);
        }
    }
}

impl Drop for FrozenFs {
    fn drop(&mut self) {
        if self.frozen {
            let _ = Command::new("fsfreeze").arg("-u").arg(&self.mount).status();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = fs::remove_file(&self.image);
    }
}

/// A child that starts a writer into the frozen file system in the background (it sleeps
/// there in state D), records the writer's pid, and exits 0 at once.
fn stuck_child(frozen: &Path) -> String {
    format!(
        r#"( echo late > "{}/file" ) & echo $! > "$D/writer.tmp"; mv "$D/writer.tmp" "$D/writer.pid"; exit 0"#,
        frozen.display()
    )
}

/// The holders run with --wait, which releases at once after a clean exit (no --min-hold
/// keep to hide an early release). The holder's child exits leaving `writer` stuck in state D: for `STUCK_FOR` the holder
/// must not exit and the standby must not start; once thawed, the writer dies of its
/// pending SIGKILL, the holder exits with its child's status and the standby runs.
fn assert_held_until_the_tree_is_gone(
    sb: &Sandbox,
    frozen: &mut FrozenFs,
    mut holder: Wrapper,
    standby: Command,
    records: &str,
) {
    let writer = sb.wait_pid(&format!("{records}writer.pid"));
    wait_for(|| proc_state(writer) == Some('D'), SOON, "the writer to sleep in state D");
    let mut standby = sb.spawn("standby", standby);
    let until = Instant::now() + STUCK_FOR;
    while Instant::now() < until {
        assert_eq!(proc_state(writer), Some('D'), "the writer is still stuck");
        assert!(
            !sb.exists(&format!("{records}standby-ran")),
            "the standby started while a process of the holder's tree lived: holder {:?}",
            holder.stderr()
        );
        assert!(holder.try_status().is_none(), "the holder ended while its tree lived: {:?}", holder.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    let said = holder.stderr();
    assert_eq!(said.matches("outlives SIGKILL").count(), 1, "the holder says once why it keeps the lease: {said:?}");
    frozen.thaw();
    wait_for(|| !pid_alive(writer), SOON, "the writer to die of its pending SIGKILL once thawed");
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 0, "the child's own status");
    assert_eq!(standby.wait_code(WITHIN_A_LEASE), 0, "the standby ran: {:?}", standby.stderr());
    assert!(sb.exists(&format!("{records}standby-ran")));
}

#[test]
fn a_grandchild_in_state_d_keeps_the_lease_held_with_a_cgroup() {
    let sb = Sandbox::new();
    let mut frozen = FrozenFs::new(sb.path());
    let script = stuck_child(&frozen.mount);
    let args = ["--lock", "stuck", "--ttl", "3s", "--kill-after", "1s", "--lock-delay", "60s", "--wait"];
    let holder = sb.spawn("holder", sb.cmd(&[&args[..], &["--", "sh", "-c", &script]].concat()));
    let standby = sb.cmd(&["--lock", "stuck", "--wait", "--", "sh", "-c", r#"touch "$D/standby-ran""#]);
    assert_held_until_the_tree_is_gone(&sb, &mut frozen, holder, standby, "");
    drop(frozen);
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_grandchild_in_state_d_keeps_the_lease_held_with_the_process_group_alone() {
    let sb = Sandbox::new();
    let mut frozen = FrozenFs::new(sb.path());
    // As nobody (65534), who gets no cgroup here: the process group alone holds the tree.
    let dir = sb.file("nobody");
    fs::create_dir(&dir).expect("mkdir");
    nix::unistd::chown(&dir, Some(65534.into()), Some(65534.into())).expect("chown to nobody");
    let store = format!("sqlite://{}/locks.db", dir.display());
    let script = stuck_child(&frozen.mount);
    let as_nobody = |args: &[&str]| {
        let mut cmd = sb.bare_unprivileged();
        cmd.args(["--store", &store]).args(args).env("D", &dir);
        cmd
    };
    let mut holder_cmd =
        as_nobody(&["--lock", "stuck", "--ttl", "3s", "--kill-after", "1s", "--lock-delay", "60s", "--wait"]);
    holder_cmd.args(["-vv", "--", "sh", "-c", &script]);
    let holder = sb.spawn("holder", holder_cmd);
    wait_for(|| sb.exists("nobody/writer.pid"), SOON, "the holder's child to start");
    assert!(holder.stderr().contains("no cgroup for the child"), "the process group alone: {:?}", holder.stderr());
    let standby = as_nobody(&["--lock", "stuck", "--wait", "--", "sh", "-c", r#"touch "$D/standby-ran""#]);
    assert_held_until_the_tree_is_gone(&sb, &mut frozen, holder, standby, "nobody/");
    drop(frozen);
    sb.wait_no_processes_left(SOON);
}
