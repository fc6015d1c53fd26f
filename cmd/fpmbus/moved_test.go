package main

import (
	"github.com/fpmbus/fpmbus/internal/buildinfo"
	"github.com/fpmbus/fpmbus/internal/flaghelp"
)

// What the help tests name that moved out of cmd: the rule by which -h leaves a flag out
// (internal/flaghelp) and what `fpmbus version` reports (internal/buildinfo).
var isDeprecatedAlias = flaghelp.IsDeprecatedAlias

type versionInfo = buildinfo.Info
