// Starts Swagger UI on /docs (the page policy forbids inline scripts, so the configuration lives here).
"use strict";

// The operator's own credential (METRICS_TOKEN, handlers/openapi.py) is not a customer's: this page, the customers'
// docs, leaves out the scheme and the operations only it opens (/metrics). /openapi.json keeps both, for the
// operator's tools.
const OPERATOR_SCHEMES = ["metricsToken"];

function forCustomers(doc) {
  const operators = (op) => (op.security || []).some((s) => Object.keys(s).some((n) => OPERATOR_SCHEMES.includes(n)));
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) if (operators(op)) delete item[method];
    if (!Object.keys(item).length) delete doc.paths[path];
  }
  OPERATOR_SCHEMES.forEach((name) => delete doc.components.securitySchemes[name]);
  return doc;
}

window.addEventListener("DOMContentLoaded", async function () {
  const xsrf = document.querySelector('meta[name="xsrf-token"]').content;
  // Each data endpoint is listed once (/social); the /twitter aliases only on request.
  const aliases = new URLSearchParams(location.search).get("aliases") === "true";
  const toggle = document.getElementById("aliases");
  toggle.href = aliases ? "/docs" : "/docs?aliases=true";
  toggle.textContent = aliases ? "Hide the /twitter aliases" : "Also list the /twitter aliases";
  const url = "/openapi.json" + (aliases ? "?aliases=true" : "");
  let source;
  try {
    source = { spec: forCustomers(await (await fetch(url, { credentials: "same-origin" })).json()) };
  } catch (err) {
    source = { url }; // Swagger UI reads it again, and says what went wrong
  }
  window.ui = SwaggerUIBundle({
    ...source,
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null, // no calls to an outside validator
    displayRequestDuration: true,
    // The portal's session cookie rides along on same-origin calls: its writes need the XSRF token.
    requestInterceptor: function (request) {
      if ((request.method || "GET").toUpperCase() !== "GET") request.headers["X-XSRFToken"] = xsrf;
      return request;
    },
  });
});
