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
 * <p>Encoding of a chunk: fields separated by U+0001, each field followed by one. The first field
 * is empty, or U+0002 where some docid or stored document holds a U+0001: then, inside those fields,
 * U+0002 U+0003 stands for U+0001 and U+0002 U+0002 for U+0002 (a valid JSON document holds neither
 * unescaped, so the form is rare; with it any text can be sent). The fields after it are n hit counts
 * (one per query of the chunk, in order), then for the H hits of those queries in order H scores and
 * H document numbers, then the docid and the stored document of each of the D documents first seen
 * in this chunk (D docids, then D stored documents, empty where the index stores none). Python's
 * {@code parse_raw} reads the stored documents: a Java reader of the JSON earned too little to keep
 * (docs/results.md). Documents are numbered 0, 1, ... in the order they are first sent within a batch;
 * a hit names its document by that number, so a passage found by several queries of a batch crosses
 * JNI once. The docid sent is Anserini's (Python takes the document's own "id" where it has one). A
 * score is the Java float widened to double and printed by {@link Double#toString(double)}, which
 * Python's {@code float()} reads back to the same double.
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
      String raw = (String) get.invoke(doc, RAW);
      r.raw = raw == null ? "" : raw;
      return r;
    }
  }

  /** One hit's fields. */
  private static final class Row {
    int luceneId;  // Lucene's number for the document; -1 where unknown
    String docid = "";
    String score = "";
    String raw = "";  // the stored document; empty where there is none
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
    int size = 0;
    for (int i = 0; i < total; i++) {
      Row r = all[i];
      Integer known = r.luceneId < 0 ? null : sent.numbers.get(r.luceneId);
      if (known == null) {
        known = sent.count++;
        if (r.luceneId >= 0) {
          sent.numbers.put(r.luceneId, known);
        }
        fresh[d++] = r;
        size += r.docid.length() + r.raw.length() + 2;
      }
      numbers[i] = known;
    }
    boolean escape = false;  // whether a sent field holds the separator (rare: not valid JSON)
    for (int j = 0; j < d && !escape; j++) {
      escape = fresh[j].docid.indexOf(SEP) >= 0 || fresh[j].raw.indexOf(SEP) >= 0;
    }
    StringBuilder out = new StringBuilder(size + 16 * (perQuery.length + 2 * total) + 2);
    if (escape) {
      out.append(ESC);  // the first field, empty in the plain form, marks the escaped form
    }
    out.append(SEP);
    for (Row[] hits : perQuery) {
      out.append(hits.length).append(SEP);
    }
    for (Row r : all) {
      out.append(r.score).append(SEP);
    }
    for (int n : numbers) {
      out.append(n).append(SEP);
    }
    for (int j = 0; j < d; j++) {
      field(out, fresh[j].docid, escape);
    }
    for (int j = 0; j < d; j++) {
      field(out, fresh[j].raw, escape);
    }
    return out.toString();
  }

  /** One field and its separator; in the escaped form ESC is written as ESC ESC and SEP as ESC U+0003. */
  private static void field(StringBuilder out, String src, boolean escape) {
    if (!escape) {
      out.append(src).append(SEP);
      return;
    }
    for (int i = 0; i < src.length(); i++) {
      char c = src.charAt(i);
      if (c == SEP) {
        out.append(ESC).append('\u0003');
      } else if (c == ESC) {
        out.append(ESC).append(ESC);
      } else {
        out.append(c);
      }
    }
    out.append(SEP);
  }
}
