#!/usr/bin/env bash
# Installs the coding agents the integration tests drive (integration/agents_test.go)
# from npm, at the versions verified against the Edge, and prints the directory of
# their commands (claude, codex) on stdout:
#
#   IOP_AGENTS_BIN=$(.ci/agents.sh) go test ./integration -run TestCodingAgents
#
# They go into a cache directory named after the versions ($IOP_AGENTS_DIR, default
# ~/.cache/iop/agents), so a second run installs nothing, and a version bump here
# installs beside the old one. npm's own cache (~/.npm) keeps the downloads.
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0

root="${IOP_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/iop/agents}"
dir="$root/claude-code-$CLAUDE_CODE_VERSION+codex-$CODEX_VERSION"
bin="$dir/node_modules/.bin"

# installed says whether both commands run and are the pinned versions.
installed() {
	[ -x "$bin/claude" ] && [ -x "$bin/codex" ] || return 1
	"$bin/claude" --version 2>/dev/null | grep -qF "$CLAUDE_CODE_VERSION" &&
		"$bin/codex" --version 2>/dev/null | grep -qF "$CODEX_VERSION"
}

if ! installed; then
	command -v npm >/dev/null 2>&1 || { echo "agents.sh: npm is needed to install the coding agents" >&2; exit 1; }
	echo "--- installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION @openai/codex@$CODEX_VERSION into $dir" >&2
	# Into a fresh directory, moved into place only once complete: an install
	# cut short is never taken for a finished one.
	mkdir -p "$root"
	tmp="$(mktemp -d "$root/.install.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
	npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error \
		"@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
	# Claude Code's postinstall puts its native binary in place of a stub;
	# where npm did not run it (ignore-scripts), run it now.
	if ! "$tmp/node_modules/.bin/claude" --version >/dev/null 2>&1; then
		(cd "$tmp/node_modules/@anthropic-ai/claude-code" && node install.cjs) >&2
	fi
	rm -rf "$dir"
	mv "$tmp" "$dir"
	trap - EXIT
	installed || { echo "agents.sh: the agents in $dir do not run or are not the pinned versions" >&2; exit 1; }
fi
echo "$bin"
