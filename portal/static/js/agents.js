// Use with AI agents: the gateway's MCP server (/mcp on this page's own origin) configured for one of the account's
// keys, for Claude Code, Cursor, Claude Desktop and the `mcp` Python client. The key's secret is fetched (GET
// /keys/{key_id}/reveal) only when the person asks to show or copy it; until then each configuration names the
// key by its prefix, and choosing another key or leaving the view forgets the secret.
import { $, $$, copy, el } from "./dom.js";
import { act, api, listGeneration, state } from "./api.js";
import { keyState } from "./keys.js";

const view = $("#view-agents");
const keysList = listGeneration(); // a slow earlier list must not replace the newer one's keys
const mcpUrl = location.origin + "/mcp";
const NAME = "social-gateway"; // the server's name in each client's list of MCP servers
// The secret of the chosen key, once fetched, and whether the configurations show it or the placeholder.
const secret = { keyId: null, value: null, shown: false };

// Each configuration as text, for a key (the secret, or the placeholder while it is hidden).
const CONFIGS = {
  "claude-code": (key) =>
    `claude mcp add --transport http ${NAME} ${mcpUrl} --header "Authorization: Bearer ${key}"`,
  cursor: (key) =>
    JSON.stringify({ mcpServers: { [NAME]: { url: mcpUrl, headers: { Authorization: "Bearer " + key } } } }, null, 2),
  // Claude Desktop's own file starts local (stdio) servers only: the mcp-remote bridge speaks HTTP for it. The
  // header goes through an environment variable: an argument with a space is split on some systems.
  "claude-desktop": (key) =>
    JSON.stringify({
      mcpServers: {
        [NAME]: {
          command: "npx",
          args: ["-y", "mcp-remote", mcpUrl, "--header", "Authorization:${AUTH_HEADER}"],
          env: { AUTH_HEADER: "Bearer " + key },
        },
      },
    }, null, 2),
  python: (key) => [
    "import asyncio",
    "",
    "from mcp import Client",
    "from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client",
    "",
    `URL = "${mcpUrl}"`,
    `KEY = "${key}"`,
    "",
    "",
    "async def main():",
    '    http = create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"})',
    "    async with http:",
    "        async with Client(streamable_http_client(URL, http_client=http)) as client:",
    "            print(await client.list_tools())",
    "",
    "",
    "asyncio.run(main())",
    "",
  ].join("\n"),
};

function usable(key) {
  return !key.revoked && !["expired", "rolled"].includes(keyState(key)); // its secret would be refused
}
function chosenKey() {
  return state.keys.find((k) => String(k.key_id) === $("#agents-key").value);
}

export async function loadAgents() {
  forget();
  draw(); // no secret on the page while the list loads (another account's, after a switch)
  const list = keysList.restart();
  await act($("#agents-form"), null, async () => {
    const keys = await api("GET", "/keys");
    if (!keysList.isCurrent(list)) return;
    state.keys = keys;
    const select = $("#agents-key");
    const keep = select.value;
    select.textContent = "";
    keys.filter(usable).forEach((k) => {
      const option = el("option", k.name + " (" + k.prefix + "…)");
      option.value = k.key_id;
      select.append(option);
    });
    if (keep) select.value = keep;
    if (!select.value && select.options.length) select.selectedIndex = 0;
    const none = select.options.length === 0;
    $("#agents-no-key").hidden = !none;
    $("#agents-form").hidden = none;
    $("#agents-configs").hidden = none;
    draw();
  });
}

function forget() {
  secret.keyId = null;
  secret.value = null;
  secret.shown = false;
}

function draw() {
  const key = chosenKey();
  const text = !key ? "" : secret.shown && secret.keyId === key.key_id ? secret.value : key.prefix + "…";
  $$("[data-config]", view).forEach((code) => (code.textContent = key ? CONFIGS[code.dataset.config](text) : ""));
  $("#agents-reveal").textContent = secret.shown ? "Hide key" : "Show key";
  $("#agents-url").textContent = mcpUrl;
}

// The chosen key's secret, asked of the gateway the first time it is needed.
async function revealed(scope, trigger) {
  const key = chosenKey();
  if (secret.keyId === key.key_id && secret.value) return secret.value;
  const shown = await act(scope, trigger, () => api("GET", "/keys/" + key.key_id + "/reveal"));
  if (!shown || chosenKey() !== key) return null; // failed, or another key was chosen meanwhile
  secret.keyId = key.key_id;
  secret.value = shown.key;
  return shown.key;
}

// Leaving the view (another view, logging out) takes the secret off the page.
window.addEventListener("hashchange", () => {
  if (location.hash === "#agents") return;
  forget();
  draw();
});
$("#agents-key").addEventListener("change", () => {
  forget();
  draw();
});
$("#agents-reveal").addEventListener("click", async () => {
  if (secret.shown) {
    secret.shown = false;
  } else if (await revealed($("#agents-form"), $("#agents-reveal"))) {
    secret.shown = true;
  }
  draw();
});
// Copying copies the working configuration, with the secret, whether or not the page shows it.
$$("[data-copy]", view).forEach((trigger) =>
  trigger.addEventListener("click", async () => {
    const box = trigger.closest(".card");
    const status = $("[role=status]", box);
    status.textContent = "";
    const value = await revealed(box, trigger);
    if (value) copy(CONFIGS[trigger.dataset.copy](value), status);
  }));
