// The Changes tab: "what changed" in a repository — `GET /v1/git/status` and `GET /v1/git/diff`
// of a directory (default: the session's cwd field), against a base revision (default HEAD). The
// session list offers every session the daemon recorded a `gitBase` for (`GET /v1/acp` rows'
// `sessions`): picking one shows what that session changed, its commits included. Read when the
// tab is shown or on Show, never polled. Patches are shown as text (one span per line, classed by
// its first character), at most MAX_PATCH_LINES lines a file.

import { api } from "./api";
import { byId, clear, h } from "./dom";
import type { GitDiffFile, GitFileStatus, SessionGitBase } from "sandbox-agent";

const MAX_PATCH_LINES = 2000;

interface Choice extends SessionGitBase {
  serverId: string;
}

export class ChangesPanel {
  private readonly pathInput = byId<HTMLInputElement>("changes-path");
  private readonly baseInput = byId<HTMLInputElement>("changes-base");
  private readonly sessionSelect = byId<HTMLSelectElement>("changes-session");
  private readonly summary = byId("changes-summary");
  private readonly files = byId("changes-files");
  private readonly diff = byId("changes-diff");
  private choices: Choice[] = [];
  private busy = false;

  constructor(private readonly onError: (error: unknown) => void) {
    byId("changes-form").addEventListener("submit", (e) => {
      e.preventDefault();
      void this.load();
    });
    this.sessionSelect.addEventListener("change", () => {
      const c = this.choices[Number(this.sessionSelect.value)];
      if (!c) return;
      this.pathInput.value = c.cwd;
      this.baseInput.value = c.gitBase;
      void this.load();
    });
  }

  /** On showing the tab: the sessions with a recorded base, then the changes of the path. */
  async show(): Promise<void> {
    await this.listSessions();
    await this.load();
  }

  private async listSessions(): Promise<void> {
    try {
      const servers = await api().listInstances();
      this.choices = servers.flatMap((s) => (s.sessions ?? []).map((x) => ({ ...x, serverId: s.serverId })));
    } catch (error) {
      this.onError(error);
      return;
    }
    const picked = this.sessionSelect.value;
    this.sessionSelect.replaceChildren(
      h("option", { value: "" }, this.choices.length ? "— pick a session —" : "no session in a repository"),
      ...this.choices.map((c, i) =>
        h("option", { value: String(i), "data-session-id": c.sessionId }, `${c.serverId} · ${c.sessionId} · ${c.cwd}`),
      ),
    );
    if (picked && this.choices[Number(picked)]) this.sessionSelect.value = picked;
  }

  private async load(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    const path = this.pathInput.value.trim() || byId<HTMLInputElement>("cwd").value.trim() || ".";
    const base = this.baseInput.value.trim() || undefined;
    try {
      const [status, diff] = await Promise.all([api().gitStatus(path), api().gitDiff(path, base)]);
      this.pathInput.value = path;
      const where = status.branch ? `on ${status.branch}` : status.head ? "detached HEAD" : "no commit yet";
      const sync = status.upstream ? ` · ${status.upstream} ↑${status.ahead ?? 0} ↓${status.behind ?? 0}` : "";
      const adds = diff.files.reduce((n, f) => n + f.additions, 0);
      const dels = diff.files.reduce((n, f) => n + f.deletions, 0);
      this.summary.textContent = `${where}${status.head ? ` at ${status.head.slice(0, 12)}` : ""}${sync} · ${diff.files.length} file(s) changed since ${diff.base.slice(0, 12)}, +${adds} −${dels}`;
      clear(this.files);
      for (const f of status.files) this.files.append(statusRow(f));
      if (!status.files.length) this.files.append(h("li", { class: "muted" }, "clean work tree"));
      this.diff.replaceChildren(...diff.files.map(fileDiff));
    } catch (error) {
      this.summary.textContent = "";
      clear(this.files);
      clear(this.diff);
      this.onError(error);
    } finally {
      this.busy = false;
    }
  }
}

function statusRow(f: GitFileStatus): HTMLElement {
  return h(
    "li",
    { "data-testid": "changes-file", "data-path": f.path, "data-status": f.status, "data-staged": String(f.staged) },
    h("span", { class: `git-status git-${f.status}` }, f.status),
    f.staged ? h("span", { class: "muted" }, " staged") : null,
    ` ${f.oldPath ? `${f.oldPath} → ` : ""}${f.path}`,
  );
}

function fileDiff(f: GitDiffFile): HTMLElement {
  const pre = h("pre", { class: "diff", "data-role": "patch" });
  if (f.binary) {
    pre.append(h("span", { class: "d-same" }, "(binary file)"));
  } else {
    const lines = f.patch.split("\n");
    if (lines.length && lines[lines.length - 1] === "") lines.pop();
    for (const line of lines.slice(0, MAX_PATCH_LINES)) pre.append(h("span", { class: lineClass(line) }, `${line}\n`));
    if (lines.length > MAX_PATCH_LINES) {
      pre.append(h("span", { class: "muted" }, `… ${lines.length - MAX_PATCH_LINES} more lines`));
    }
  }
  return h(
    "div",
    { class: "diff-block", "data-testid": "changes-diff-file", "data-path": f.path },
    h("div", {}, h("span", { class: `git-status git-${f.status}` }, f.status), ` ${f.oldPath ? `${f.oldPath} → ` : ""}${f.path} `, h("span", { class: "muted" }, `+${f.additions} −${f.deletions}`)),
    pre,
  );
}

/** A patch line's class: added, removed, a hunk header, or context (and git's own headers). */
export function lineClass(line: string): string {
  if (line.startsWith("+++") || line.startsWith("---")) return "d-meta";
  if (line.startsWith("+")) return "d-add";
  if (line.startsWith("-")) return "d-del";
  if (line.startsWith("@@")) return "d-hunk";
  if (line.startsWith(" ")) return "d-same";
  return "d-meta";
}
