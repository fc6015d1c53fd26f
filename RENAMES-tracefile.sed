# Renames of the trace file format's move into the new package tracefile/.
# New import path: github.com/fpmbus/fpmbus/tracefile (package tracefile). Add it where these apply.
#
# schemas -> tracefile (the trace's file names and read order; schemas keeps the trace line)
s/\bschemas\.TraceSegmentSuffix\b/tracefile.SegmentSuffix/g
s/\bschemas\.MaxTraceOutputBaseName\b/tracefile.MaxOutputBaseName/g
s/\bschemas\.TraceProducerFileName\b/tracefile.ProducerFileName/g
s/\bschemas\.TraceOutputBase\b/tracefile.OutputBase/g
s/\bschemas\.TraceSegmentPrefix\b/tracefile.SegmentPrefix/g
s/\bschemas\.TraceSegmentPath\b/tracefile.SegmentPath/g
s/\bschemas\.TraceSegmentIndex\b/tracefile.SegmentIndex/g
s/\bschemas\.ParseTraceSegmentPath\b/tracefile.ParseSegmentPath/g
s/\bschemas\.ListTraceSegments\b/tracefile.ListSegments/g
s/\bschemas\.NextTraceSegmentIndex\b/tracefile.NextSegmentIndex/g
s/\bschemas\.TraceProducers\b/tracefile.Producers/g
s/\bschemas\.TraceSegmentFilesIn\b/tracefile.SegmentFilesIn/g
s/\bschemas\.TraceReadOrder\b/tracefile.ReadOrder/g
s/\bschemas\.TraceSegment\b/tracefile.Segment/g
s/\bschemas\.SanitizeProducerID\b/tracefile.SanitizeProducerID/g
#
# consumers/trace -> tracefile, outside consumers/trace (the forwarders of segment.go are gone; the
# tools moved). Inside consumers/trace the same names, unqualified, become tracefile.<Name>.
s/\btrace\.\(SegmentSuffix\|Segment\|SanitizeProducerID\|ProducerFileName\|OutputBase\|SegmentPrefix\|SegmentPath\|ListSegments\|NextSegmentIndex\|Producers\)\b/tracefile.\1/g
s/\btrace\.\(Info\|InfoReport\|ErrNoSegments\|ErrNotGzip\|ErrNotTrace\|LineError\|ProducerInfo\|SegmentInfo\|Damage\|KeyInfo\|IDRange\)\b/tracefile.\1/g
s/\btrace\.\(Verify\|VerifyConfig\|VerifyReport\|VerifyProducer\|VerifySegment\|VerifyProgress\|Finding\|Heal\|MissingLines\|LineID\|ErrSegmentChanged\|ErrStreamSharded\)\b/tracefile.\1/g
s/\btrace\.\(Finding[A-Za-z]\+\|Heal[A-Za-z]\+\)\b/tracefile.\1/g
s/\btrace\.\(ReadSegment\|CorruptError\|Repair\|RepairResult\|RepairOutput\|ErrTornLine\|ErrMemberTooLarge\)\b/tracefile.\1/g
s/\btrace\.\(ErrPrefixHeld\|PrefixLockPath\|DefaultCompressionLevel\)\b/tracefile.\1/g
# Verify takes tracefile's options and returns tracefile.ErrInvalidConfig for a bad VerifyConfig:
s/\btracefile\.Verify(\(.*\)trace\.WithLogger(/tracefile.Verify(\1tracefile.WithLogger(/g
#
# Inside consumers/trace (unexported before, exported by tracefile now). Apply to consumers/trace/*.go
# only, and check each hit: owner methods and record fields have common names.
s/\bmsgMeta\b/tracefile.MsgMeta/g
s/\bsubjectKeys\b/tracefile.SubjectKeys/g
s/\bcheckFPM\b/tracefile.CheckFPM/g
s/\bfpmIdent\b/tracefile.FPMIdent/g
s/\bappendLine(\([^,]*\), r,/tracefile.AppendLine(\1, \&r.Record,/g
s/\blineIdentity\b/tracefile.LineIdentity/g
s/\bidentityOf\b/tracefile.IdentityOf/g
s/\brecoverySlack\b/tracefile.RecoverySlack/g
s/\brepairPrefixes\b/tracefile.RepairPrefixes/g
s/\bremoveRepairLeftovers\b/tracefile.RemoveRepairLeftovers/g
s/\brepairTmpSuffix\b/tracefile.RepairTmpSuffix/g
s/\bverifyTmpSuffix\b/tracefile.VerifyTmpSuffix/g
s/\bmaxOutputBaseName\b/tracefile.MaxOutputBaseName/g
s/\bnewOwner\b/tracefile.NewOwner/g
s/\bownOutput\b/tracefile.OwnOutput/g
s/\brefusesProducer\b/tracefile.RefusesProducer/g
s/\bnameRefused\b/tracefile.NameRefused/g
s/\*owner\b/*tracefile.Owner/g
s/\.\(own\|o\)\.\(take\|rejecting\|release\|releaseAll\|retry\|owns\|prefixes\|takeOutput\)(/.\1.\u\2(/g
# record (consumers/trace/line.go) now embeds tracefile.Record: its fields are exported. By hand:
#   r.key -> r.Key, r.body -> r.Body, r.fpm -> r.FPM (workerID/dpRank/counterID -> WorkerID/DPRank/
#   CounterID), r.observed -> r.Observed, r.producer -> r.Producer, r.seq -> r.Seq, r.stored -> r.Stored;
#   msgMeta{seq:, stored:} -> tracefile.MsgMeta{Seq:, Stored:}; record{key: ...} ->
#   record{Record: tracefile.Record{Key: ...}}; parseRecord keeps its signature (tracefile types).
# Test helpers: testFPM.body/msg delegate to streamstest.FPMBody/FPMMsg (new, streams/streamstest/fpm.go).
