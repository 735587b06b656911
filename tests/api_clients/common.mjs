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

// The first half of a 20x9 PNG (tests/data/vision/tiny_20x9.png): a truncated image, which every
// API must refuse with one 400 naming the part, as each client shows it. Its headers are whole, so
// a text-only model (these tests' default) refuses it as an image it cannot take, after reading
// the headers only; a model with a tower refuses the cut-off body when it decodes it.
export const truncatedPng = "iVBORw0KGgoAAAANSUhEUgAAABQAAAAJCAIAAAC9o5sfAAACMElEQVR4nAElAtr9AZDRFwcJx1yS6+yWeR4WND5T9Wf2Xe7zFg3pI2r/qo6hoBmdMpCpxH9UMIgCASl4fn02QmuqTLfgjEQSPQFy1pejvrQ1ZTJiBmSsOS8GqFbkxBjTt1E0EXMF2qmsfkxJOi+xbAroLSn17zX/XrKOueJhwlHDIbs/y0gAcswRAq1AFhUiI8UJ27ZRSkJqgTKSKsjR+ltojDTHlSrmhrXdj0o2tU3X+xMEByPYHbq7SXVOoqPr3Q6qAUMrto7hPcu66uW8Z9koNMqfjLjnVjoDvq90aciri8p6gcbhRSm9xWnkZ+ypXSRCy+I4Ag4T/LK3XLRaGwR8HMcJHsPVSu8bjzNfEQw=";
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
