# embed-sql.awk - turns the SQL of sql/ into C string literals, so that the library needs no .sql file
# at run time.  Usage:
#   awk -f tools/embed-sql.awk sql/NNN_*.sql sql/roles.sql sql/functions/*.sql \
#       sql/router/NNN_*.sql sql/router/roles.sql sql/router/functions/*.sql > migrations.c
# The numbered files are the migrations, in order; roles.sql is the optional role grants; the files
# under functions/ define every function, applied after the migrations (src/migrate.c).  The files
# under router/ are the same for a router database (`pgjobq migrate --router`), whose function files
# also include each file of sql/functions that says "-- router: also" in its first five lines.
BEGIN {
    print "/* Generated from sql/ by tools/embed-sql.awk: do not edit. */"
    print "#include <stddef.h>"
    n = 0
    nf = 0
    rn = 0
    rnf = 0
    rfc = 0
    open = 0
}
FNR == 1 {
    if (open) print ";"
    open = 1
    name = FILENAME
    sub(/.*\//, "", name)
    if (FILENAME ~ /(^|\/)router\//) {
        if (FILENAME ~ /\/functions\//) {
            kind = "router function"
            rfc++
            rnf++
            rfiles[rnf] = "rf" rfc
            rfnames[rnf] = name
            printf "static const char rf%d[] =\n", rfc
        } else if (name == "roles.sql") {
            kind = "router roles"
            printf "static const char router_roles[] =\n"
        } else {
            kind = "router migration"
            rn++
            rnames[rn] = name
            printf "static const char r%d[] =\n", rn
        }
    } else if (FILENAME ~ /(^|\/)functions\//) {
        kind = "function"
        nf++
        fnames[nf] = name
        printf "static const char f%d[] =\n", nf
    } else if (name == "roles.sql") {
        kind = "roles"
        printf "static const char roles[] =\n"
    } else {
        kind = "migration"
        n++
        names[n] = name
        needs[n] = n
        printf "static const char m%d[] =\n", n
    }
}
# "-- needs: N" in a migration's header: libraries of schema version N and later can use the database
# once it is applied (by default only libraries that know the migration).
FNR <= 5 && kind == "migration" && /^-- needs: [0-9]+$/ {
    needs[n] = $3 + 0
}
# "-- router: also" in a function file's header: a router database has its functions too.
FNR <= 5 && kind == "function" && /^-- router: also$/ {
    rnf++
    rfiles[rnf] = "f" nf
    rfnames[rnf] = fnames[nf]
}
{
    printf "    \"%s\\n\"\n", cstring($0)
}
# A line as the inside of a C string literal.  Character by character, not gsub: what a backslash in
# gsub's replacement means differs between awks (mawk's "\\\\" left a backslash single).
function cstring(s,    out, i, c) {
    out = ""
    for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "\\")
            out = out "\\\\"
        else if (c == "\"")
            out = out "\\\""
        else if (c == "\t")
            out = out "\\t"
        else
            out = out c
    }
    return out
}
END {
    if (open) print ";"
    print "const char *const pgjobq__migrations[] = {"
    for (i = 1; i <= n; i++) printf "    m%d,\n", i
    print "    NULL};"
    print "const char *const pgjobq__migration_names[] = {"
    for (i = 1; i <= n; i++) printf "    \"%s\",\n", names[i]
    print "    NULL};"
    print "const int pgjobq__migration_needs[] = {"
    for (i = 1; i <= n; i++) printf "    %d,\n", needs[i]
    print "    0};"
    printf "const int pgjobq__migration_count = %d;\n", n
    print "const char *const pgjobq__roles_sql = roles;"
    print "const char *const pgjobq__function_files[] = {"
    for (i = 1; i <= nf; i++) printf "    f%d,\n", i
    print "    NULL};"
    print "const char *const pgjobq__function_file_names[] = {"
    for (i = 1; i <= nf; i++) printf "    \"%s\",\n", fnames[i]
    print "    NULL};"
    printf "const int pgjobq__function_file_count = %d;\n", nf
    print "const char *const pgjobq__router_migrations[] = {"
    for (i = 1; i <= rn; i++) printf "    r%d,\n", i
    print "    NULL};"
    print "const char *const pgjobq__router_migration_names[] = {"
    for (i = 1; i <= rn; i++) printf "    \"%s\",\n", rnames[i]
    print "    NULL};"
    printf "const int pgjobq__router_migration_count = %d;\n", rn
    print "const char *const pgjobq__router_roles_sql = router_roles;"
    print "const char *const pgjobq__router_function_files[] = {"
    for (i = 1; i <= rnf; i++) printf "    %s,\n", rfiles[i]
    print "    NULL};"
    print "const char *const pgjobq__router_function_file_names[] = {"
    for (i = 1; i <= rnf; i++) printf "    \"%s\",\n", rfnames[i]
    print "    NULL};"
    printf "const int pgjobq__router_function_file_count = %d;\n", rnf
}
