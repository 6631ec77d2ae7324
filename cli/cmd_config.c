/*
 * cmd_config.c - `ferry config --print [--config FILE] [--flag value ...]`:
 * the configuration a command would run with, read the way every command
 * reads it (file, environment, flags), printed as JSON with each setting's
 * source, secrets redacted. What an operator runs before `serve` to see
 * which of three places a value came from. `--docs` prints the table of
 * every setting that the README carries (`make docs`).
 */
#include <stdio.h>

#include "cli.h"

int cmd_config(const ferry_config *cfg)
{
    if (cfg->docs) {
        config_print_markdown(stdout);
        return 0;
    }
    if (!cfg->print) return cli_error(EXIT_USAGE, "config: nothing to do (give --print, or --docs for the settings table)");
    /* what serve would refuse is refused here too, with serve's message */
    engine_opts eo;
    int rc = serve_settings_check(cfg, &eo);
    if (rc) return rc;
    strbuf sb;
    sb_init(&sb);
    config_print_json(&sb, cfg);
    if (sb.oom) {
        sb_free(&sb);
        return cli_error(EXIT_RUNTIME, "out of memory");
    }
    fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
    return 0;
}
