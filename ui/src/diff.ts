// A line diff for the transcript's diff view: longest common subsequence over lines, bounded so
// a huge file cannot stall the page (beyond the bound every old line is shown removed and every
// new line added, which is still correct, just not minimal).

export interface DiffLine {
  op: "same" | "add" | "del";
  text: string;
}

const MAX_CELLS = 1_000_000;

export function lineDiff(oldText: string, newText: string): DiffLine[] {
  const a = oldText === "" ? [] : oldText.split("\n");
  const b = newText === "" ? [] : newText.split("\n");
  // Common head and tail need no table.
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const head: DiffLine[] = a.slice(0, start).map((text) => ({ op: "same", text }));
  const tail: DiffLine[] = a.slice(endA).map((text) => ({ op: "same", text }));
  const x = a.slice(start, endA);
  const y = b.slice(start, endB);
  const n = x.length;
  const m = y.length;
  if (n * m > MAX_CELLS) {
    return [...head, ...x.map((text) => ({ op: "del" as const, text })), ...y.map((text) => ({ op: "add" as const, text })), ...tail];
  }
  // lcs[i][j]: length of the LCS of x[i..] and y[j..], in one flat array.
  const w = m + 1;
  const lcs = new Uint32Array((n + 1) * w);
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i * w + j] = x[i] === y[j] ? lcs[(i + 1) * w + j + 1] + 1 : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
    }
  }
  const mid: DiffLine[] = [];
  let i = 0;
  let j = 0;
  while (i < n && j < m) {
    if (x[i] === y[j]) {
      mid.push({ op: "same", text: x[i] });
      i++;
      j++;
    } else if (lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
      mid.push({ op: "del", text: x[i++] });
    } else {
      mid.push({ op: "add", text: y[j++] });
    }
  }
  while (i < n) mid.push({ op: "del", text: x[i++] });
  while (j < m) mid.push({ op: "add", text: y[j++] });
  return [...head, ...mid, ...tail];
}
