// eslint for the lab page's own modules (web/static/*.js): plain browser ES modules, no
// bundler. Run by `python3 quickstart.py test` (and `npm run lint`); installed from npm at
// setup with the vendor files (scripts/build_web.py). The vendored third-party files are
// not ours to lint.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["web/static/vendor/**", "node_modules/**"] },
  {
    files: ["web/static/**/*.js"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: { ...globals.browser, uPlot: "readonly" },
    },
    rules: {
      ...js.configs.recommended.rules,
      "no-unused-vars": ["error", { args: "after-used", argsIgnorePattern: "^_", caughtErrors: "none" }],
      eqeqeq: ["error", "always", { null: "ignore" }],
      "no-var": "error",
      "prefer-const": "error",
    },
  },
];
