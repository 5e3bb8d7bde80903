//! The man pages and shell completions are generated from the clap definitions in
//! `src/cli.rs` and checked in; this test fails when they are stale.
//!
//! Regenerate with: `UPDATE_GENERATED=1 cargo test --test generated_docs`

use std::path::{Path, PathBuf};

use clap_complete::Shell;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every generated file: path relative to the repository, and its expected content.
fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let command = leaderrun::cli::command();
    files.push((PathBuf::from("man/leaderrun.1"), main_page(&command)));
    for sub in command.get_subcommands() {
        let name = format!("leaderrun-{}", sub.get_name());
        let sub = sub.clone().name(name.clone()).display_name(name.clone()).bin_name(name.clone());
        let mut page = Vec::new();
        clap_mangen::Man::new(sub).render(&mut page).unwrap();
        files.push((PathBuf::from(format!("man/{name}.1")), page));
    }
    for (shell, file) in [(Shell::Bash, "leaderrun.bash"), (Shell::Zsh, "_leaderrun"), (Shell::Fish, "leaderrun.fish")]
    {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command.clone(), "leaderrun", &mut script);
        files.push((PathBuf::from("completions").join(file), script));
    }
    files
}

/// clap_mangen's sections, then the ones `--help` shows after the options, as real roff.
fn main_page(command: &clap::Command) -> Vec<u8> {
    use leaderrun::cli::{stores, CHILD_ENVIRONMENT, CHILD_ENVIRONMENT_NOTE, EXAMPLES, EXIT_STATUS, SAFETY_CONTRACT};
    use roff::{bold, roman, Roff};
    let man = clap_mangen::Man::new(command.clone());
    let mut page = Vec::new();
    man.render_title(&mut page).unwrap();
    man.render_name_section(&mut page).unwrap();
    man.render_synopsis_section(&mut page).unwrap();
    man.render_description_section(&mut page).unwrap();
    man.render_options_section(&mut page).unwrap();
    man.render_subcommands_section(&mut page).unwrap();
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (status, meaning) in EXIT_STATUS {
        roff.control("TP", []).text([bold(*status)]).text([roman(*meaning)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    roff.text([roman("leaderrun sets these for the child:")]);
    for (name, meaning) in CHILD_ENVIRONMENT {
        roff.control("TP", []).text([bold(*name)]).text([roman(*meaning)]);
    }
    roff.control("PP", []).text([roman(CHILD_ENVIRONMENT_NOTE)]);
    roff.control("SH", ["SAFETY CONTRACT"]);
    for paragraph in SAFETY_CONTRACT {
        roff.control("PP", []).text([roman(*paragraph)]);
    }
    roff.control("SH", ["STORES"]);
    for (url, what) in stores() {
        roff.control("TP", []).text([bold(url)]).text([roman(what)]);
    }
    roff.control("SH", ["EXAMPLES"]);
    for (line, what) in EXAMPLES {
        roff.control("TP", []).text([bold(*line)]).text([roman(*what)]);
    }
    roff.to_writer(&mut page).unwrap();
    man.render_version_section(&mut page).unwrap();
    page
}

#[test]
fn man_pages_and_completions_are_current() {
    let update = std::env::var_os("UPDATE_GENERATED").is_some();
    let mut stale = Vec::new();
    for (path, expected) in generated() {
        let full = root().join(&path);
        let current = std::fs::read(&full).unwrap_or_default();
        if current != expected {
            if update {
                std::fs::create_dir_all(full.parent().unwrap()).unwrap();
                std::fs::write(&full, &expected).unwrap();
            } else {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files: {stale:?}; regenerate with: UPDATE_GENERATED=1 cargo test --test generated_docs"
    );
}

#[test]
fn the_man_page_documents_every_flag_env_var_and_exit_status() {
    let page = String::from_utf8(std::fs::read(root().join("man/leaderrun.1")).unwrap()).unwrap();
    let page = page.replace("\\-", "-");
    for arg in leaderrun::cli::command().get_arguments() {
        if let Some(long) = arg.get_long() {
            assert!(page.contains(&format!("--{long}")), "man page lacks --{long}");
        }
        if let Some(env) = arg.get_env() {
            assert!(page.contains(env.to_str().unwrap()), "man page lacks {env:?}");
        }
    }
    for needle in [
        "EXIT STATUS",
        "SAFETY CONTRACT",
        "STORES",
        "postgres://",
        "mysql://",
        "LEADERRUN_FENCING_TOKEN",
        "75",
        "69",
        "126",
        "127",
    ] {
        assert!(page.contains(needle), "man page lacks {needle}");
    }
    assert!(Path::new(&root().join("completions/_leaderrun")).exists());
}
