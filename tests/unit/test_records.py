from __future__ import annotations

import json

from crashdrill.trainer.records import RecordWriter, bits_to_float32, float32_bits, read_records


def test_float32_bits_round_trip_and_distinguish_neighbours():
    x = 2.302585092994046
    assert bits_to_float32(float32_bits(x)) == float(bits_to_float32(float32_bits(x)))
    assert float32_bits(1.0) == 0x3F800000
    assert float32_bits(1.0) != float32_bits(1.0000001)


def test_reader_takes_complete_lines_only_and_resumes_from_offset(tmp_path):
    w = RecordWriter(tmp_path, segment=0)
    w.write("step", step=1, loss=2.0)
    path = tmp_path / "records.jsonl"
    with open(path, "a") as f:
        f.write('{"v":1,"kind":"step","step":2')  # a kill mid-line
    recs, off = read_records(path)
    assert [r["step"] for r in recs] == [1]
    again, off2 = read_records(path, off)
    assert again == [] and off2 == off


def test_a_new_writer_ends_a_torn_line_so_records_stay_parseable(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"v":1,"kind":"step","step":1}\n{"v":1,"kind":"st')
    w = RecordWriter(tmp_path, segment=1)
    w.event("fresh_start", "Restarted and found no checkpoint.")
    recs, _ = read_records(path)
    assert [r["kind"] for r in recs] == ["step", "event"]
    assert recs[1]["segment"] == 1
    assert all(json.loads(line) for line in path.read_text().splitlines()[:1])
