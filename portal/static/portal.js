// The portal's script: draws every view from the gateway's JSON API. No framework, no build step: ES modules
// (js/), one per view, over shared helpers (js/dom.js for the page, js/api.js for the API and its errors).
// This file is the only one the page names (with its content hash); the modules it imports are revalidated.
import { route } from "./js/views.js";
import { start } from "./js/session.js";

window.addEventListener("hashchange", route);
start();
