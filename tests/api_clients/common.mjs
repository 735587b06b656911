// Shared by the client scripts: a check that fails with a message, and a guard that turns any
// warning or error an SDK prints (a stream it could not parse, an unexpected event) into a
// failure, since the clients must accept the server's shapes without complaint.
export function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
}

export function failOnClientWarnings() {
  for (const level of ["warn", "error"]) {
    const original = console[level];
    console[level] = (...args) => {
      original(...args);
      process.exitCode = 1;
      throw new Error(`the client printed a ${level}: ${args.join(" ")}`);
    };
  }
}

export const base = process.env.DELTAFIN_BASE_URL;
export const key = process.env.DELTAFIN_API_KEY || "unused";

// A Chat Completions request with fetch (for comparing prompts and greedy answers).
export async function chat(body) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });
  check(r.ok, `chat completions answered ${r.status}`);
  return r.json();
}
