package turngym.lucene;

import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Runs Anserini searches and hands their hits to Python as strings, one per chunk of queries, so that
 * Python pays one JNI call per chunk instead of four per hit, and decodes one chunk while the worker
 * threads search and read the next.
 *
 * <p>Each query is Anserini's own single-query {@code SimpleSearcher.search(query, k)}, the search its
 * {@code batch_search} runs for every query; the workers also read each hit's stored document as they
 * go, so no pass over the hits is left for after the search.
 *
 * <p>Anserini and Lucene are reached by reflection, so this file compiles against the JDK alone
 * (any javac with {@code --release 11}) whatever Java version the Anserini jar was built for.
 *
 * <p>Encoding of a chunk: fields separated by U+0001. The first field is empty, or U+0002 where some
 * docid, title or text holds a U+0001: then, inside those fields, U+0002 U+0003 stands for U+0001
 * and U+0002 U+0002 for U+0002 (in a JSON document only an escaped control character puts one
 * there, so the form is rare; with it any text can be sent). The fields after it are
 * n hit counts (one per query of the chunk, in order), then for the H hits of those
 * queries in order H scores and H document numbers, then the docid, title and text of each of the
 * D documents first seen in this chunk (D docids, D titles, then D texts), and last one field listing
 * (comma-separated) those of the D documents that only Python may read: not a JSON object, a used
 * field that is not a string, an escape that Python keeps as a lone surrogate, and so on. Documents
 * are numbered 0, 1, ... in the order they are first sent within a batch; a hit names its document
 * by that number, so a passage found by several queries of a batch crosses JNI once. For a document
 * left to Python the title field holds the raw stored document and the text field is empty; for all
 * others title and text are exactly what turngym's Python {@code parse_raw} gives. The docid is the
 * document's own "id" string where it has one, else Anserini's docid. A score is the Java float
 * widened to double and printed by {@link Double#toString(double)}, which Python's {@code float()}
 * reads back to the same double.
 */
public final class BatchHits {
  private static final String RAW = "raw";
  private static final char SEP = '\u0001';  // between fields
  private static final char ESC = '\u0002';  // escapes SEP and itself inside fields, in the escaped form

  private BatchHits() {}

  /**
   * Starts searching {@code queries} (top {@code k} each; an empty query gets no hits) on
   * {@code threads} worker threads; {@link Pending#next} hands over the hits of queries
   * [0, chunk), [chunk, 2 chunk), ... in that order.
   */
  public static Pending start(Object searcher, String[] queries, int k, int threads, int chunk) throws Throwable {
    return new Pending(searcher, queries, k, threads, chunk);
  }

  /** Anserini's single-query {@code search(query, k)}, on the calling thread. */
  public static String searchOne(Object searcher, String query, int k) throws Throwable {
    return encode(new Row[][] {new Reader(searcher, k).search(query)}, new Sent());
  }

  private static Object invoke(Method m, Object target, Object... args) throws Throwable {
    try {
      return m.invoke(target, args);
    } catch (InvocationTargetException e) {
      throw e.getCause();  // Anserini's own exception, not the reflection wrapper
    }
  }

  /** A batch being searched: its chunks' encodings, handed over in query order. */
  public static final class Pending {
    private final String[] queries;
    private final int chunk;
    private final Row[][] rows;  // per query, until its chunk is encoded
    private final AtomicInteger[] left;  // per chunk, queries not yet searched
    private final String[] ready;  // per chunk, its encoding until handed over
    private final AtomicInteger claim = new AtomicInteger();
    private final boolean[] searched;  // per chunk, every query searched
    private final Sent sent = new Sent();  // touched only by the one thread that holds `encoding`
    private int encodedUpTo;  // chunks before it are encoded (or being encoded)
    private boolean encoding;
    private int cursor;
    private Throwable failure;
    private volatile boolean closed;

    Pending(Object searcher, String[] queries, int k, int threads, int chunk) throws Throwable {
      if (chunk < 1) {
        throw new IllegalArgumentException("chunk must be at least 1, got " + chunk);
      }
      this.queries = queries;
      this.chunk = chunk;
      int n = queries.length;
      int chunks = (n + chunk - 1) / chunk;
      rows = new Row[n][];
      ready = new String[chunks];
      searched = new boolean[chunks];
      left = new AtomicInteger[chunks];
      for (int c = 0; c < chunks; c++) {
        left[c] = new AtomicInteger(Math.min(n, (c + 1) * chunk) - c * chunk);
      }
      // Up to the first non-empty query the caller searches itself, before any worker starts: Anserini
      // makes its IndexSearcher on the first search, unguarded, and a wrong searcher also fails here.
      Reader own = new Reader(searcher, k);
      while (true) {
        int i = claim.getAndIncrement();
        if (i >= n) {
          break;
        }
        process(i, own);
        if (queries[i] != null && !queries[i].isEmpty()) {
          break;
        }
      }
      int workers = Math.min(Math.max(1, threads), Math.max(0, n - claim.get()));
      for (int w = 0; w < workers; w++) {
        Reader reader = new Reader(searcher, k);
        Thread t = new Thread(() -> work(reader), "turngym-batchhits-" + w);
        t.setDaemon(true);  // a batch Python gave up on never holds the JVM open
        t.start();
      }
    }

    private void work(Reader reader) {
      try {
        while (!closed) {
          int i = claim.getAndIncrement();
          if (i >= queries.length) {
            return;
          }
          process(i, reader);
        }
      } catch (Throwable e) {
        synchronized (this) {
          if (failure == null) {
            failure = e;
          }
          closed = true;
          notifyAll();
        }
      }
    }

    /** Searches query i; the worker that completes a chunk also encodes it, and any searched chunks
     * after it, in chunk order (a document is numbered where it is first sent). */
    private void process(int i, Reader reader) throws Throwable {
      rows[i] = reader.search(queries[i]);
      int c = i / chunk;
      if (left[c].decrementAndGet() > 0) {
        return;
      }
      synchronized (this) {  // every other query of the chunk is searched and visible from here on
        searched[c] = true;
        if (encoding) {
          return;  // the thread encoding now will reach this chunk
        }
        encoding = true;
      }
      while (true) {
        int next;
        synchronized (this) {
          if (encodedUpTo >= ready.length || !searched[encodedUpTo] || closed) {
            encoding = false;
            return;
          }
          next = encodedUpTo++;
        }
        int lo = next * chunk;
        int hi = Math.min(queries.length, lo + chunk);
        String encoded = encode(Arrays.copyOfRange(rows, lo, hi), sent);
        Arrays.fill(rows, lo, hi, null);
        synchronized (this) {
          ready[next] = encoded;
          notifyAll();
        }
      }
    }

    /** The next chunk's encoding (waits for it), or null after the last; a worker's error, or the
     * batch's closing, is thrown. */
    public synchronized String next() throws Throwable {
      if (cursor >= ready.length) {
        return null;
      }
      while (ready[cursor] == null && failure == null) {
        wait();
      }
      if (failure != null) {
        throw failure;
      }
      String encoded = ready[cursor];
      ready[cursor++] = null;
      return encoded;
    }

    /** Stops the workers after the queries they hold (Python gave up on the rest); next() throws
     * from now on, also where it is waiting. */
    public synchronized void close() {
      closed = true;
      if (failure == null) {
        failure = new CancellationException("this batch search was closed");
      }
      Arrays.fill(ready, null);
      notifyAll();
    }
  }

  /** Anserini's single-query search and the reading of its hits, for one thread. */
  private static final class Reader {
    private final Object searcher;
    private final Method search;
    private final Object[] args;
    private Field docidF;
    private Field luceneIdF;  // null where the hit class has none
    private Field scoreF;
    private Field docF;
    private Method get;

    Reader(Object searcher, int k) throws NoSuchMethodException {
      this.searcher = searcher;
      this.search = searcher.getClass().getMethod("search", String.class, int.class);
      this.args = new Object[] {null, k};
    }

    Row[] search(String query) throws Throwable {
      if (query == null || query.isEmpty()) {
        return new Row[0];
      }
      args[0] = query;
      Object[] hits = (Object[]) invoke(search, searcher, args);
      Row[] out = new Row[hits == null ? 0 : hits.length];
      for (int i = 0; i < out.length; i++) {
        out[i] = row(hits[i]);
      }
      return out;
    }

    private Row row(Object h) throws ReflectiveOperationException {
      if (docidF == null) {
        Class<?> c = h.getClass();
        docidF = c.getField("docid");
        scoreF = c.getField("score");
        docF = c.getField("lucene_document");
        try {
          luceneIdF = c.getField("lucene_docid");
        } catch (NoSuchFieldException e) {
          luceneIdF = null;  // every hit then sends its document
        }
      }
      Row r = new Row();
      r.luceneId = luceneIdF == null ? -1 : luceneIdF.getInt(h);
      r.score = Double.toString(scoreF.getFloat(h));
      String docid = (String) docidF.get(h);
      r.docid = docid == null ? "" : docid;
      Object doc = docF.get(h);
      if (doc == null) {
        return r;
      }
      if (get == null) {
        get = doc.getClass().getMethod("get", String.class);
      }
      r.raw = (String) get.invoke(doc, RAW);
      return r;
    }
  }

  /** One hit's fields; its stored document is read only where the batch sends it (see {@link #read}). */
  private static final class Row {
    int luceneId;  // Lucene's number for the document; -1 where unknown
    String docid = "";
    String score = "";
    String raw;  // the stored document, until read
    Piece title = new Piece();
    Piece text = new Piece();
    boolean handedBack;  // a stored document left for Python's parse (the title holds it)

    /** Title, text and the document's own id from the stored document. */
    void read() {
      if (raw == null || raw.isEmpty()) {
        return;
      }
      Doc parsed = RawDoc.parse(raw);
      if (parsed == null) {
        title.set(raw, 0, raw.length());
        handedBack = true;
      } else {
        if (parsed.id != null) {
          docid = parsed.id;
        }
        title = parsed.title;
        text = parsed.text;
      }
      raw = null;
    }
  }

  /** The documents a batch has sent so far: Lucene's number to the batch's document number. */
  private static final class Sent {
    final Map<Integer, Integer> numbers = new HashMap<>();
    int count;
  }

  private static String encode(Row[][] perQuery, Sent sent) {
    int total = 0;
    for (Row[] hits : perQuery) {
      total += hits.length;
    }
    Row[] all = new Row[total];
    int at = 0;
    for (Row[] hits : perQuery) {
      System.arraycopy(hits, 0, all, at, hits.length);
      at += hits.length;
    }
    int[] numbers = new int[total];
    Row[] fresh = new Row[total];  // the documents this chunk sends first
    int d = 0;
    for (int i = 0; i < total; i++) {
      Row r = all[i];
      Integer known = r.luceneId < 0 ? null : sent.numbers.get(r.luceneId);
      if (known == null) {
        known = sent.count++;
        if (r.luceneId >= 0) {
          sent.numbers.put(r.luceneId, known);
        }
        r.read();  // once per document and batch
        fresh[d++] = r;
      }
      numbers[i] = known;
    }
    boolean escape = false;  // whether a sent field holds the separator (rare: an escaped control character)
    for (int j = 0; j < d && !escape; j++) {
      escape = fresh[j].docid.indexOf(SEP) >= 0 || fresh[j].title.contains(SEP) || fresh[j].text.contains(SEP);
    }
    StringBuilder head = new StringBuilder();
    if (escape) {
      head.append(ESC);  // the first field, empty in the plain form, marks the escaped form
    }
    head.append(SEP);
    for (Row[] hits : perQuery) {
      head.append(hits.length).append(SEP);
    }
    for (Row r : all) {
      head.append(r.score).append(SEP);
    }
    for (int n : numbers) {
      head.append(n).append(SEP);
    }
    StringBuilder rawDocs = new StringBuilder();
    for (int j = 0; j < d; j++) {
      if (fresh[j].handedBack) {
        rawDocs.append(rawDocs.length() > 0 ? "," : "").append(sent.count - d + j);
      }
    }
    if (escape) {
      for (int j = 0; j < d; j++) {
        escaped(head, fresh[j].docid, 0, fresh[j].docid.length()).append(SEP);
      }
      for (int j = 0; j < d; j++) {
        escaped(head, fresh[j].title.src, fresh[j].title.from, fresh[j].title.to).append(SEP);
      }
      for (int j = 0; j < d; j++) {
        escaped(head, fresh[j].text.src, fresh[j].text.from, fresh[j].text.to).append(SEP);
      }
      return head.append(rawDocs).toString();
    }
    for (int j = 0; j < d; j++) {
      head.append(fresh[j].docid).append(SEP);
    }
    int size = head.length() + 2 * d + rawDocs.length();
    for (int j = 0; j < d; j++) {
      size += fresh[j].title.length() + fresh[j].text.length();
    }
    char[] buf = new char[size];
    int p = head.length();
    head.getChars(0, p, buf, 0);
    for (int j = 0; j < d; j++) {
      p = fresh[j].title.copyTo(buf, p);
      buf[p++] = SEP;
    }
    for (int j = 0; j < d; j++) {
      p = fresh[j].text.copyTo(buf, p);
      buf[p++] = SEP;
    }
    rawDocs.getChars(0, rawDocs.length(), buf, p);
    return new String(buf);
  }

  /** src[from, to) with ESC written as ESC ESC and SEP as ESC U+0003. */
  private static StringBuilder escaped(StringBuilder out, String src, int from, int to) {
    for (int i = from; i < to; i++) {
      char c = src.charAt(i);
      if (c == SEP) {
        out.append(ESC).append('\u0003');
      } else if (c == ESC) {
        out.append(ESC).append(ESC);
      } else {
        out.append(c);
      }
    }
    return out;
  }

  /** Every BMP character that Python's {@code str.isspace()} accepts (for tests). */
  public static String pythonSpaces() {
    StringBuilder sb = new StringBuilder();
    for (char c = 0; c < '\ud800'; c++) {
      if (RawDoc.isPySpace(c)) {
        sb.append(c);
      }
    }
    return sb.toString();
  }

  /** What {@link RawDoc#parse} makes of one stored document: {id or null, title, text}, or null
   * where Python must parse it (for tests). */
  public static String[] parseRaw(String raw) {
    Doc d = RawDoc.parse(raw);
    return d == null ? null : new String[] {d.id, d.title.toString(), d.text.toString()};
  }

  /**
   * A strict JSON reader for one stored document that keeps only what turngym's {@code parse_raw}
   * reads ("id", "title", "text", "contents") and gives up (null) wherever Python's {@code json}
   * and {@code str()} could answer differently: invalid JSON, a top level that is not an object,
   * a used field that is not a string, an escaped surrogate that is not a pair, deep nesting,
   * very long numbers.
   */
  static final class RawDoc {
    private static final int ABSENT = 0;
    private static final int STRING = 1;
    private static final int NULL = 2;
    private static final int OTHER = 3;
    private static final int MAX_DEPTH = 200;
    private static final int MAX_NUMBER = 1000;
    private static final String[] KEYS = {"id", "title", "text", "contents"};

    private final String s;
    private int pos;
    private boolean escaped;  // whether the last string read had an escape
    private boolean controlEscaped;  // whether the last string read had an escape of a control character
    private int nextQuote = -1;  // the first quote at or after the last runEnd (the length if none)
    private int nextBackslash = -1;  // likewise for a backslash
    private final int[] kinds = new int[4];
    private final int[] starts = new int[4];  // opening quote of each used string
    private final int[] ends = new int[4];  // closing quote
    private final boolean[] plain = new boolean[4];  // no escapes: the value is s[start + 1, end)

    private RawDoc(String s) {
      this.s = s;
    }

    /** The first quote, backslash or control character at or after {@code from} (the length if none). */
    private int runEnd(int from) {
      String t = s;
      if (nextQuote < from) {
        nextQuote = t.indexOf('"', from);  // vectorised by the JIT, unlike a loop over charAt
        nextQuote = nextQuote < 0 ? t.length() : nextQuote;
      }
      if (nextBackslash < from) {
        nextBackslash = t.indexOf('\\', from);
        nextBackslash = nextBackslash < 0 ? t.length() : nextBackslash;
      }
      int end = Math.min(nextQuote, nextBackslash);
      for (int i = from; i < end; i++) {
        if (t.charAt(i) < 0x20) {
          return i;
        }
      }
      return end;
    }

    static Doc parse(String raw) {
      RawDoc r = new RawDoc(raw);
      try {
        return r.document();
      } catch (IllegalArgumentException e) {
        return null;
      }
    }

    private Doc document() {
      ws();
      if (pos >= s.length() || s.charAt(pos) != '{') {
        throw bad();
      }
      object(0, true);
      ws();
      if (pos != s.length()) {
        throw bad();
      }
      String id;
      if (kinds[0] == STRING) {
        id = stringAt(0);
      } else if (kinds[0] == ABSENT || kinds[0] == NULL) {
        id = null;
      } else {
        throw bad();
      }
      Doc d = new Doc(id);
      if (kinds[1] != ABSENT && kinds[2] != ABSENT) {
        if (kinds[1] != STRING || kinds[2] != STRING) {
          throw bad();
        }
        piece(1, d.title);
        piece(2, d.text);
        return d;
      }
      if (kinds[3] == ABSENT) {
        return d;  // no contents: empty title and text
      }
      if (kinds[3] != STRING) {
        throw bad();
      }
      Piece c = new Piece();
      piece(3, c);
      // Search-R1's contents: the first line, stripped (Python's str.strip()) less one enclosing quote pair, is the title
      int nl = c.src.indexOf('\n', c.from);
      int firstEnd = nl < 0 || nl >= c.to ? c.to : nl;
      int a = c.from;
      int b = firstEnd;
      while (a < b && isPySpace(c.src.charAt(a))) {
        a++;
      }
      while (b > a && isPySpace(c.src.charAt(b - 1))) {
        b--;
      }
      if (b - a >= 2 && c.src.charAt(a) == '"' && c.src.charAt(b - 1) == '"') {
        a++;  // exactly one enclosing pair, as turngym's Python split_contents
        b--;
      }
      d.title.set(c.src, a, b);
      d.title.noControl = c.noControl;
      if (firstEnd < c.to) {
        d.text.set(c.src, firstEnd + 1, c.to);
        d.text.noControl = c.noControl;
      }
      return d;
    }

    private String stringAt(int slot) {
      pos = starts[slot];  // backwards: runEnd's cached positions may be past an earlier quote
      nextQuote = -1;
      nextBackslash = -1;
      return string(true);
    }

    /** A used string field, as a range of the stored document where it has no escapes. */
    private void piece(int slot, Piece out) {
      if (plain[slot]) {
        out.set(s, starts[slot] + 1, ends[slot]);
        out.noControl = true;  // an unescaped JSON string has none: the reader refuses them raw
      } else {
        controlEscaped = false;
        String v = stringAt(slot);
        out.set(v, 0, v.length());
        out.noControl = !controlEscaped;  // only an escape can put one in
      }
    }

    private static IllegalArgumentException bad() {
      return new IllegalArgumentException();
    }

    private void ws() {
      while (pos < s.length()) {
        char c = s.charAt(pos);
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
          return;
        }
        pos++;
      }
    }

    private char peek() {
      if (pos >= s.length()) {
        throw bad();
      }
      return s.charAt(pos);
    }

    private void expect(char c) {
      if (peek() != c) {
        throw bad();
      }
      pos++;
    }

    /** An object starting at '{'; at the top level the four keys are recorded (last one wins). */
    private void object(int depth, boolean top) {
      if (!opens('{', '}', depth)) {
        return;
      }
      do {
        ws();
        String key = string(true);
        ws();
        expect(':');
        ws();
        int slot = top ? slot(key) : -1;
        if (slot >= 0 && peek() == '"') {
          starts[slot] = pos;  // read later, and only if used
          escaped = false;
          string(false);
          ends[slot] = pos - 1;
          plain[slot] = !escaped;
          kinds[slot] = STRING;
        } else if (slot >= 0 && s.startsWith("null", pos)) {
          pos += 4;
          kinds[slot] = NULL;
        } else {
          value(depth + 1);
          if (slot >= 0) {
            kinds[slot] = OTHER;
          }
        }
      } while (more('}'));
    }

    private static int slot(String key) {
      for (int i = 0; i < KEYS.length; i++) {
        if (KEYS[i].equals(key)) {
          return i;
        }
      }
      return -1;
    }

    private void array(int depth) {
      if (!opens('[', ']', depth)) {
        return;
      }
      do {
        ws();
        value(depth + 1);
      } while (more(']'));
    }

    /** Reads the opening bracket; false where the container is empty (its closing bracket read too). */
    private boolean opens(char open, char close, int depth) {
      if (depth > MAX_DEPTH) {
        throw bad();
      }
      expect(open);
      ws();
      if (peek() == close) {
        pos++;
        return false;
      }
      return true;
    }

    /** After a member: true at a comma (another follows), false at the closing bracket. */
    private boolean more(char close) {
      ws();
      char c = peek();
      pos++;
      if (c == close) {
        return false;
      }
      if (c != ',') {
        throw bad();
      }
      return true;
    }

    private void value(int depth) {
      char c = peek();
      if (c == '"') {
        string(false);
      } else if (c == '{') {
        object(depth, false);
      } else if (c == '[') {
        array(depth);
      } else if (!literal("null") && !literal("true") && !literal("false") && !literal("NaN")
          && !literal("Infinity") && !literal("-Infinity")) {
        number();
      }
    }

    private boolean literal(String word) {
      if (s.startsWith(word, pos)) {
        pos += word.length();
        return true;
      }
      return false;
    }

    /** -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)? as Python's json reads it. */
    private void number() {
      int start = pos;
      if (peek() == '-') {
        pos++;
      }
      char c = peek();
      if (c == '0') {
        pos++;
      } else if (c >= '1' && c <= '9') {
        digits();
      } else {
        throw bad();
      }
      if (pos < s.length() && s.charAt(pos) == '.') {
        pos++;
        digits();
      }
      if (pos < s.length() && (s.charAt(pos) == 'e' || s.charAt(pos) == 'E')) {
        pos++;
        if (peek() == '+' || peek() == '-') {
          pos++;
        }
        digits();
      }
      if (pos - start > MAX_NUMBER) {
        throw bad();  // Python refuses int strings over 4,300 digits with a ValueError
      }
    }

    private void digits() {
      int start = pos;
      while (pos < s.length() && s.charAt(pos) >= '0' && s.charAt(pos) <= '9') {
        pos++;
      }
      if (pos == start) {
        throw bad();
      }
    }

    /** A JSON string starting at '"', unescaped (or only checked, when not {@code build});
     * control characters and escaped surrogates that do not pair are refused. */
    private String string(boolean build) {
      expect('"');
      StringBuilder sb = null;
      int start = pos;
      String t = s;
      while (true) {
        pos = runEnd(pos);
        char c = peek();
        if (c == '"') {
          pos++;
          if (!build) {
            return null;
          }
          return sb == null ? t.substring(start, pos - 1) : sb.append(t, start, pos - 1).toString();
        }
        if (c != '\\') {
          throw bad();  // a raw control character: Python's json (strict) refuses it in strings
        }
        escaped = true;
        if (build) {
          if (sb == null) {
            sb = new StringBuilder(pos - start + 64);
          }
          sb.append(t, start, pos);
        }
        pos++;
        char e = peek();
        pos++;
        char low = 0;
        switch (e) {
          case '"': case '\\': case '/': break;
          case 'b': e = '\b'; break;
          case 'f': e = '\f'; break;
          case 'n': e = '\n'; break;
          case 'r': e = '\r'; break;
          case 't': e = '\t'; break;
          case 'u': {
            e = hex4();
            if (Character.isHighSurrogate(e)) {
              if (!t.startsWith("\\u", pos)) {
                throw bad();
              }
              pos += 2;
              low = hex4();
              if (!Character.isLowSurrogate(low)) {
                throw bad();
              }
            } else if (Character.isLowSurrogate(e)) {
              throw bad();
            }
            break;
          }
          default: throw bad();
        }
        controlEscaped |= e < 0x20;
        if (build) {
          sb.append(e);
          if (low != 0) {
            sb.append(low);
          }
        }
        start = pos;
      }
    }

    private char hex4() {
      if (pos + 4 > s.length()) {
        throw bad();
      }
      int v = 0;
      for (int i = 0; i < 4; i++) {
        int d = Character.digit(s.charAt(pos + i), 16);
        if (d < 0 || s.charAt(pos + i) > 'f') {
          throw bad();  // ASCII hex digits only (Character.digit also takes full-width ones)
        }
        v = v * 16 + d;
      }
      pos += 4;
      return (char) v;
    }

    /** Python's str.isspace() (bidirectional class WS, B or S, or category Zs); all are in the BMP. */
    static boolean isPySpace(char c) {
      return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680
          || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f
          || c == 0x3000;
    }
  }

  /** A range of a string: a field of the answer, copied once, straight into it. */
  static final class Piece {
    String src = "";
    int from;
    int to;
    boolean noControl;  // known to hold no character below U+0020

    void set(String src, int from, int to) {
      this.src = src;
      this.from = from;
      this.to = to;
      this.noControl = false;
    }

    int length() {
      return to - from;
    }

    boolean contains(char c) {
      if (noControl && c < 0x20) {
        return false;
      }
      int i = src.indexOf(c, from);
      return i >= 0 && i < to;
    }

    int copyTo(char[] buf, int at) {
      src.getChars(from, to, buf, at);
      return at + to - from;
    }

    @Override
    public String toString() {
      return src.substring(from, to);
    }
  }

  /** A stored document as turngym's Python parse_raw reads it: id (null: Anserini's), title, text. */
  static final class Doc {
    final String id;
    final Piece title = new Piece();
    final Piece text = new Piece();

    Doc(String id) {
      this.id = id;
    }
  }
}
