package main

import "github.com/fpmbus/fpmbus/internal/flaghelp"

// isDeprecatedAlias is the rule by which -h leaves a flag out (internal/flaghelp), for the help tests.
var isDeprecatedAlias = flaghelp.IsDeprecatedAlias
